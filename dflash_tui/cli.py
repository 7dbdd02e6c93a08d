"""`dflash-tui`: parse where the console points (a profile, `[user@]host[:port]`, or this
machine), build the transport, and start the app; `dflash-tui demo` runs the local demo,
`dflash-tui paths` prints where the console keeps its files. `--help` needs no connection."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

# Plain modules (no Textual): `--help` stays fast and needs no terminal.
from dflash_tui.cli_args import (
    UsageError,
    build_parser,
    check_host_exists,
    check_theme,
    choose_profile,
    exec_prefix,
    wants_fleet,
)
from dflash_tui.sources.console_options import console_options
from dflash_tui.sources.known_hosts import resolve_path
from dflash_tui.sources.profiles import CONFIG_ENV, config_path, load_config

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp


# `dflash-tui replay|serve|fleet ...` (a profile of one of these names is reached as
# `dflash-tui --run-dir ... NAME` or from the fleet).
SUBCOMMANDS = ("replay", "serve", "fleet")


def build_console(args: argparse.Namespace, prefix: list[str]) -> DflashApp:
    from dflash_tui.app import DflashApp

    profile = choose_profile(args, prefix)  # refuses a bad field by name, before any lookup
    if args.where not in (None, "local", "localhost") and args.where not in load_config().profiles:
        check_host_exists(args.where)
    check_theme(profile.theme)
    transport = profile.transport()
    return DflashApp(transport, console_options(profile, transport.description))


def console_paths() -> dict[str, tuple[Path, str]]:
    """Every file and folder the console reads or writes on this machine, by platform
    (platformdirs), with what each holds."""
    import platformdirs

    from dflash_tui.demo import DemoPaths
    from dflash_tui.themes import themes_dir

    override = f" (${CONFIG_ENV} is set)" if os.environ.get(CONFIG_ENV) else ""
    return {
        "config": (config_path(), f"profiles, default_profile, [keys]{override}"),
        "themes": (themes_dir(), "the shipped colour themes"),
        "demo": (DemoPaths.default().root, "`dflash-tui demo`'s data and run"),
        "cache": (Path(platformdirs.user_cache_dir("dflash")), "converted models (the demo's)"),
        "known_hosts": (resolve_path(None), "trusted SSH host keys (OpenSSH's file)"),
        "ssh_config": (Path("~", ".ssh", "config").expanduser(), "hosts, jumps, keys"),
    }


def print_paths(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dflash-tui paths",
        description="Where the console keeps its files on this machine: the config file, "
        "themes, the demo's data, caches and SSH files. Nothing is created.",
    )
    parser.parse_args(list(argv))
    for name, (path, what) in console_paths().items():
        mark = "" if path.exists() else "  [not there yet]"
        print(f"{name:<12} {path}{mark}\n{'':<12} {what}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["paths"]:
        return print_paths(words[1:])
    if not {"-h", "--help", "--version"} & set(words):
        try:
            from dflash_tui.keymap import configured

            configured()  # a bad [keys] entry fails here, in one line, not in the app
        except ValueError as exc:  # ProfileError too
            print(f"dflash-tui: {exc}", file=sys.stderr)
            return 2
    if words and words[0] in SUBCOMMANDS:
        from dflash_tui import subcommands

        return subcommands.main(words[0], words[1:])
    parser = build_parser()
    args = parser.parse_args(words)
    try:
        if wants_fleet(args):
            from dflash_tui import subcommands

            words = ["--watch"] if args.watch else []
            words += ["--theme", args.theme] if args.theme else []
            return subcommands.main("fleet", words)
        if args.where == "demo":
            from dflash_tui.demo import run_demo

            return run_demo(watch=args.watch, theme=args.theme)
        app = build_console(args, exec_prefix(args))
    except UsageError as exc:
        parser.error(str(exc))
    except ValueError as exc:  # ProfileError, InputError: already one line naming the field
        parser.exit(2, f"dflash-tui: {exc}\n")
    app.run()
    return int(app.return_code or 0)


if __name__ == "__main__":
    sys.exit(main())
