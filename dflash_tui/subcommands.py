"""`dflash-tui replay|serve|fleet`: their arguments, checked before anything starts, and
the app or server each one runs. `--help` imports no Textual."""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_train.protocol import ROTATED_STREAM
from dflash_tui.cli_args import (
    UsageError,
    add_destination_options,
    build_parser,
    check_theme,
    choose_profile,
    exec_prefix,
    wants_fleet,
)
from dflash_tui.sources.console_options import ConsoleOptions
from dflash_tui.sources.session import WATCH_ONLY_ENV

if TYPE_CHECKING:
    from dflash_tui.replay_app import ReplayApp

LOCAL_NAMES = (None, "local", "localhost")


def replay_parser() -> argparse.ArgumentParser:
    from dflash_tui.keymap import PANES  # here: the key table imports Textual

    parser = argparse.ArgumentParser(
        prog="dflash-tui replay",
        description="The dashboard of a finished run, with a time cursor. Nothing in a "
        "replay can send a control command.",
        epilog="keys: ←/→ step, [/] previous/next checkpoint or event, Home/End, "
        f"1-{len(PANES)} panes, t theme, ? help, q quit",
    )
    parser.add_argument(
        "path",
        metavar="RUN_DIR | STREAM.jsonl",
        help="a run directory (its status.jsonl), or a status stream file on this machine "
        "(a rotated status.<run_id>.jsonl too)",
    )
    add_destination_options(
        parser,
        where_help="where RUN_DIR is: a profile or an SSH destination; none means this machine",
        run_dir=False,
    )
    return parser


def build_replay(args: argparse.Namespace) -> ReplayApp:
    from dflash_tui.replay_app import ReplayApp
    from dflash_tui.sources.replay import ReplayError, stream_path
    from dflash_tui.sources.transport import LocalTransport

    prefix = exec_prefix(args)
    path = args.path
    if args.where in LOCAL_NAMES and not prefix:
        try:
            stream = stream_path(Path(path).expanduser())
        except ReplayError as exc:
            raise UsageError(f"replay: {exc}") from None
        if not stream.is_file():
            raise UsageError(f"replay: {stream}: no such status stream")
        check_theme(args.theme)
        options = ConsoleOptions(
            target_name="local", run_dir=str(stream.parent), read_only=True, theme=args.theme
        )
        return ReplayApp(LocalTransport(), options, stream_file=stream, source=str(stream))
    stream_name = None
    if path.endswith(".jsonl"):
        name = Path(path).name
        if name != "status.jsonl":
            if not ROTATED_STREAM.fullmatch(name):
                raise UsageError(
                    f"replay: {name!r} is neither status.jsonl nor a rotated status.<run_id>.jsonl"
                )
            stream_name = name
        path = str(Path(path).parent)
    args.run_dir = path
    args.watch = True
    profile = choose_profile(args, prefix)
    check_theme(profile.theme)
    transport = profile.transport()
    options = ConsoleOptions(
        target_name=transport.description,
        run_dir=profile.run_dir,
        read_only=True,
        python=profile.python,
        theme=profile.theme,
    )
    where = f"{transport.description}:{args.path}"
    return ReplayApp(transport, options, stream_name=stream_name, source=where)


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-tui serve",
        allow_abbrev=False,  # a destination option must never be read as a prefix of ours
        usage="dflash-tui serve [--host HOST] [--port PORT] [--public-url URL] DESTINATION...",
        description="Serve a watch-only console to web browsers (textual-serve). Anyone who "
        "can reach the port can see the run; nobody can control it from there. "
        "DESTINATION... is what `dflash-tui` takes: a profile or [user@]host[:port], and its "
        "options (--container, --run-dir, ...), in any order with serve's own.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback only)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help="the address browsers use, when it differs from http://HOST:PORT",
    )
    return parser


def serve_command(destination: Sequence[str]) -> str:
    """The console each browser gets, as the one shell line textual-serve runs: every word
    quoted once. `--watch` here and the environment latch in Session both hold it read-only."""
    return shlex.join([sys.executable, "-m", "dflash_tui.cli", *destination, "--watch"])


def check_destination(destination: Sequence[str]) -> None:
    """Fail here, with the usual one line, rather than in every browser's console."""
    parser = build_parser()
    args = parser.parse_args(list(destination))
    if args.where == "demo":
        raise UsageError("serve: the demo launches a run; serve a real destination")
    if args.where is None and wants_fleet(args):
        # The fleet hands over to a dashboard by ending one app and starting the next,
        # which a browser session would see as its end.
        raise UsageError("serve: give a destination (a profile or a host), not the fleet")
    profile = choose_profile(args, exec_prefix(args))
    check_theme(profile.theme)


def run_serve(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port: {args.port} is not in 1..65535")
    check_destination(args.destination)
    try:
        from textual_serve.server import Server
    except ImportError:  # the [serve] extra: textual-serve brings aiohttp and jinja2
        raise UsageError(
            "serve: needs textual-serve: pip install 'dflash-train-console[serve]'"
        ) from None

    os.environ[WATCH_ONLY_ENV] = "1"  # inherited by every console the server starts
    host = args.host
    public = args.public_url
    if public is None:
        shown = f"[{host}]" if ":" in host else host
        public = f"http://{shown}:{args.port}"
    if not _is_loopback(host):
        print(
            f"dflash-tui serve: listening on {host}: anyone who can reach port {args.port} "
            "can watch the run",
            file=sys.stderr,
        )
    server = Server(
        serve_command(args.destination),
        host=host,
        port=args.port,
        title="dflash (watch only)",
        public_url=public,
    )
    server.serve()
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fleet_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-tui fleet",
        description="One row per profile of the config file: state, progress, throughput, "
        "loss, τ, hottest GPU, last update. Enter opens a run's dashboard, Esc comes back.",
        epilog="keys: Enter open, / filter, a add a profile, q quit",
    )
    parser.add_argument(
        "--watch", action="store_true", help="open every dashboard read-only, whatever the profile"
    )
    parser.add_argument("--theme", metavar="NAME", help="colour theme")
    return parser


def run_fleet(args: argparse.Namespace) -> int:
    from dflash_tui.fleet_console import run_fleet_console

    check_theme(args.theme)
    return run_fleet_console(watch=args.watch, theme=args.theme)


def main(command: str, argv: Sequence[str]) -> int:
    parser = {"replay": replay_parser, "serve": serve_parser, "fleet": fleet_parser}[command]()
    if command == "serve":
        # Everything that is not serve's own is the destination, options in any order.
        args, args.destination = parser.parse_known_args(list(argv))
    else:
        args = parser.parse_args(list(argv))
    try:
        if command == "serve":
            return run_serve(args)
        if command == "fleet":
            return run_fleet(args)
        app = build_replay(args)
    except UsageError as exc:
        parser.error(str(exc))
    except ValueError as exc:  # ProfileError, InputError: one line naming the field
        parser.exit(2, f"dflash-tui {command}: {exc}\n")
    app.run()
    return int(app.return_code or 0)
