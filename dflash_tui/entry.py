"""The `dflash-tui` command's first step, before anything of the [tui] extra is imported:
`--version` answers from the package alone, and a console installed without the extra
(`pip install dflash-train-console`, the trainer's side only) says in one line what to
install instead of a traceback from deep inside an import."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dflash_train import DISTRIBUTION, __version__

EXTRA_HINT = f"pip install '{DISTRIBUTION}[tui]'"


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words == ["--version"]:
        print(f"dflash-tui {__version__} ({DISTRIBUTION})")
        return 0
    try:
        from dflash_tui.cli import main as console_main
    except ModuleNotFoundError as exc:
        print(
            f"dflash-tui: {exc.name} is not installed: the console needs the [tui] extra "
            f"({EXTRA_HINT})",
            file=sys.stderr,
        )
        return 2
    return console_main(words)


if __name__ == "__main__":
    sys.exit(main())
