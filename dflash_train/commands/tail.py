"""`dflash-train tail RUN_DIR --from-seq N`: the status stream from a cursor as raw JSON
lines, optionally with a decimated summary of the past first and following new lines."""

from __future__ import annotations

import argparse
import os
import sys

from dflash_train import protocol
from dflash_train.rundir import RunDir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument(
        "--from-seq", type=int, default=-1, help="send lines with seq above this (default: all)"
    )
    parser.add_argument(
        "--run", default=None, help="the run id the cursor belongs to; another run starts over"
    )
    parser.add_argument("--follow", action="store_true", help="keep sending new lines")
    parser.add_argument(
        "--history",
        type=int,
        default=None,
        metavar="POINTS",
        help="first send a min/max-preserving summary, at most POINTS lines per series",
    )
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between file checks")


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.control.tail import tail_stream

    rundir = RunDir.at(args.run_dir)
    problem = None
    if not rundir.root.is_dir():
        problem = ("run_dir_missing", f"run_dir: {rundir.root} is not a directory")
    elif args.history is not None and args.history < 2:
        problem = ("bad_argument", f"history: {args.history} is below 2 points")
    elif args.poll <= 0:
        problem = ("bad_argument", f"poll: {args.poll} must be above 0 seconds")
    if problem is not None:
        print_reply(protocol.reply_error("tail", *problem))
        return 2
    out = sys.stdout.buffer
    try:
        tail_stream(
            rundir.status,
            out,
            from_seq=args.from_seq,
            run=args.run,
            follow=args.follow,
            history_points=args.history,
            poll_s=args.poll,
        )
    except (BrokenPipeError, KeyboardInterrupt):
        # The reader went away: leave quietly, and keep the interpreter's final flush of
        # stdout from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return 0
