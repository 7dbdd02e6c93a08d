"""`dflash-train schema`: the JSON Schema of the status stream's lines and of the control
commands' replies, generated from protocol.py (dflash_train/stream/schema.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        choices=("stream", "reply"),
        help="only a stream line (and tail's skipped notice), or only a reply",
    )
    parser.add_argument("--out", metavar="FILE", help="write it here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from dflash_train.stream.schema import document

    text = json.dumps(document(args.only), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"dflash-train schema: out: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    return 0
