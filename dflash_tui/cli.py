"""`dflash-tui`: parse where the console points (a profile, `[user@]host[:port]`, or this
machine), build the transport, and start the app; `dflash-tui demo` runs the local demo.
`--help` needs no connection and imports no Textual."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

# Plain modules (no Textual): `--help` stays fast and needs no terminal.
from dflash_tui.destination import (
    UsageError,
    build_parser,
    check_theme,
    choose_profile,
    exec_prefix,
    wants_fleet,
)
from dflash_tui.sources.console_options import console_options

if TYPE_CHECKING:
    import argparse

    from dflash_tui.app import DflashApp


# `dflash-tui replay|serve|fleet ...` (a profile of one of these names is reached as
# `dflash-tui --run-dir ... NAME` or from the fleet).
SUBCOMMANDS = ("replay", "serve", "fleet")


def build_console(args: argparse.Namespace, prefix: list[str]) -> DflashApp:
    from dflash_tui.app import DflashApp

    profile = choose_profile(args, prefix)
    check_theme(profile.theme)
    transport = profile.transport()
    return DflashApp(transport, console_options(profile, transport.description))


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
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
