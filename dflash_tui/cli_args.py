"""Where a console points: `[user@]host[:port]`, the destination options that `dflash-tui`,
`replay` and `serve` share, and the profile they resolve to. Imports no Textual, so
`--help` stays fast and needs no terminal."""

from __future__ import annotations

import argparse
import fnmatch
import shlex
import socket
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

from dflash_tui.sources.destination import check_destination
from dflash_tui.sources.profiles import Profile, load_config
from dflash_tui.sources.session import watch_only_forced


@dataclass(frozen=True)
class HostSpec:
    host: str
    username: str | None
    port: int | None


class UsageError(ValueError):
    """One line naming the argument at fault."""


# The words `dflash-tui` takes in place of a destination.
SUBCOMMAND_HELP = {
    "fleet": "every profile of the config file in one table",
    "replay": "the dashboard of a finished run, with a time cursor",
    "serve": "a watch-only console in web browsers (the [serve] extra)",
    "demo": "a real CPU training run on this machine, no host and no GPU",
    "paths": "where the console keeps its config, themes, demo data and known hosts",
}


def check_host_exists(where: str) -> None:
    """An ad-hoc destination must name a host that resolves, or an ssh_config alias; a
    mistyped word (`dflash-tui info`) would otherwise be a console that reconnects forever."""
    spec = parse_host(where)
    # A field that could reach a shell is refused by name first, before any lookup.
    check_destination("host", spec.host)
    if spec.username is not None:
        check_destination("user", spec.username)
    if _resolves(spec.host) or _ssh_config_names(spec.host):
        return
    words = ", ".join(SUBCOMMAND_HELP)
    raise UsageError(f"no profile or host named {where!r} (subcommands: {words})")


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


def _ssh_config_names(host: str, path: Path | None = None) -> bool:
    """True when a `Host` line of ~/.ssh/config matches `host` (a catch-all `*` does not:
    it names no host)."""
    path = path or Path("~", ".ssh", "config").expanduser()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    for line in lines:
        words = line.strip().replace("=", " ", 1).split()
        if len(words) < 2 or words[0].lower() != "host":
            continue
        patterns = [w for w in words[1:] if w != "*"]
        if any(w.startswith("!") and fnmatch.fnmatch(host, w[1:]) for w in patterns):
            continue
        if any(not w.startswith("!") and fnmatch.fnmatch(host, w) for w in patterns):
            return True
    return False


def parse_host(text: str) -> HostSpec:
    """`[user@]host[:port]`; IPv6 literals go in brackets: `[::1]:2222`."""
    user, _, rest = text.rpartition("@")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_text = tail.removeprefix(":") if tail.startswith(":") else ""
        if tail and not tail.startswith(":"):
            raise UsageError(f"host: cannot read {text!r}")
    else:
        host, sep, port_text = rest.partition(":")
        if not sep:
            port_text = ""
    if not host:
        raise UsageError(f"host: no host name in {text!r}")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise UsageError(f"host: port {port_text!r} is not a number in 1..65535")
        port = int(port_text)
    return HostSpec(host, user or None, port)


def exec_prefix(args: argparse.Namespace) -> list[str]:
    if args.container is not None and args.exec_prefix is not None:
        raise UsageError("--container and --exec-prefix: give one, not both")
    if args.container is not None:
        if not args.container.isdigit():
            raise UsageError(
                f"--container: expected a numeric container id, got {args.container!r}"
            )
        return ["pct", "exec", args.container, "--"]
    if args.exec_prefix is not None:
        try:
            words = shlex.split(args.exec_prefix)
        except ValueError as exc:
            raise UsageError(f"--exec-prefix: cannot split: {exc}") from None
        if not words:
            raise UsageError("--exec-prefix: empty")
        return words
    return []


def wants_fleet(args: argparse.Namespace) -> bool:
    """No destination, no flag that names one, profiles in the config and none marked as
    the default: the console opens on the fleet of every profile."""
    named = ("where", "container", "exec_prefix", "run_dir", "python", "jump")
    if any(getattr(args, name, None) is not None for name in named):
        return False
    config = load_config()
    return bool(config.profiles) and config.default_profile is None


def choose_profile(args: argparse.Namespace, prefix: list[str]) -> Profile:
    """The profile named by WHERE (or the default one), or an ad-hoc one for a host, with
    the command line's flags on top."""
    config = load_config()
    where = args.where
    if where is None or where in config.profiles:
        profile = config.get(where)
    elif where in ("local", "localhost"):
        profile = Profile(where)
    else:
        spec = parse_host(where)
        profile = Profile(where, host=spec.host, port=spec.port, user=spec.username)
    changes: dict[str, object] = {}
    if prefix:
        changes |= {"container": None, "exec_prefix": tuple(prefix)}
    for name in ("run_dir", "python", "jump", "theme"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.watch or watch_only_forced():
        # A console that `dflash-tui serve` started for a browser only watches, and says so.
        changes["watch"] = True
    return replace(profile, **changes)  # type: ignore[arg-type]


def check_theme(name: str | None) -> None:
    from dflash_tui.themes import load_themes

    known = [t.name for t in load_themes()]
    if name is not None and name not in known:
        raise UsageError(f"--theme: unknown theme {name!r} (known: {', '.join(known)})")


def build_parser() -> argparse.ArgumentParser:
    from dflash_train import DISTRIBUTION, __version__
    from dflash_tui.keymap import PANES  # here: the key table imports Textual

    parser = argparse.ArgumentParser(
        prog="dflash-tui",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Operator console for dflash training runs.\n\nsubcommands (each "
        "takes --help):\n"
        + "\n".join(f"  {name:<7} {text}" for name, text in SUBCOMMAND_HELP.items()),
        epilog=textwrap.fill(
            "keys: l launch, R restart, S stop, m hs_min_ready, L log, e events, "
            "v/z/x/h plots, i details, c checkpoints, d dismiss alerts, r reconnect, "
            f"1-{len(PANES)} panes, t theme, p pause, ? help (all keys), q quit (the run "
            "keeps running)",
            width=78,
        ),
    )
    add_destination_options(
        parser,
        where_help="a profile from the config file, an SSH destination, or 'demo'; none "
        "means this machine (or the fleet of every profile, when the config has profiles "
        "and no default_profile)",
    )
    parser.add_argument(
        "--watch", action="store_true", help="read only: no launch, restart, stop or set"
    )
    parser.add_argument(
        "--version", action="version", version=f"dflash-tui {__version__} ({DISTRIBUTION})"
    )
    return parser


def add_destination_options(
    parser: argparse.ArgumentParser, *, where_help: str, run_dir: bool = True
) -> None:
    """Where the console points: the options `dflash-tui`, `replay` and `serve` share."""
    parser.add_argument("where", nargs="?", metavar="PROFILE | [user@]host[:port]", help=where_help)
    box = parser.add_mutually_exclusive_group()
    box.add_argument("--container", metavar="ID", help="run commands in `pct exec ID --`")
    box.add_argument(
        "--exec-prefix", metavar='"..."', help='argv prefix, e.g. "docker exec trainer"'
    )
    if run_dir:
        parser.add_argument("--run-dir", metavar="DIR", help="the run directory on the box")
    parser.add_argument(
        "--python", metavar="PATH", help="Python on the box that has dflash_train installed"
    )
    parser.add_argument("--jump", metavar="HOST", help="SSH jump host, [user@]host[:port]")
    parser.add_argument("--theme", metavar="NAME", help="colour theme (t cycles them)")
