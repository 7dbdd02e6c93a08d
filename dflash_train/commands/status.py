"""`dflash-train status RUN_DIR`: running / finished / crashed / stalled / not_started,
with pid, run id, last seq and step, age of the last line and, for a crash, the log tail."""

from __future__ import annotations

import argparse

from dflash_train import protocol
from dflash_train.rundir import RunDir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument(
        "--stall-after",
        type=float,
        default=120.0,
        help="seconds without a line before a live run counts as stalled (default 120)",
    )


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.control.run_status import run_status

    rundir = RunDir.at(args.run_dir)
    if not args.stall_after > 0:
        error = f"stall-after: {args.stall_after} must be above 0 seconds"
        reply = protocol.reply_error("status", "bad_argument", error)
    elif not rundir.root.is_dir():
        error = f"run_dir: {rundir.root} is not a directory"
        reply = protocol.reply_error("status", "run_dir_missing", error, state="not_started")
    else:
        reply = protocol.reply_ok("status", **run_status(rundir, stall_after_s=args.stall_after))
    print_reply(reply)
    return 0 if reply.ok else 1
