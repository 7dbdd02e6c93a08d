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
    parser.add_argument(
        "--stream",
        metavar="NAME",
        default=None,
        help="a rotated stream of RUN_DIR (status.<run_id>.jsonl) instead of status.jsonl; "
        "it no longer grows, so not with --follow",
    )


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
    elif args.stream is not None:
        problem = _check_stream(rundir, args.stream, args.follow)
    if problem is not None:
        print_reply(protocol.reply_error("tail", *problem))
        return 2
    out = sys.stdout.buffer
    try:
        tail_stream(
            rundir.status if args.stream is None else rundir.root / args.stream,
            out,
            from_seq=args.from_seq,
            run=args.run,
            follow=args.follow,
            history_points=args.history,
            poll_s=args.poll,
            # A rotated stream's run is over; the live one's trainer is watched.
            lock=rundir.lock if args.stream is None else None,
        )
    except (BrokenPipeError, KeyboardInterrupt):
        # The reader went away: leave quietly, and keep the interpreter's final flush of
        # stdout from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return 0


def _check_stream(rundir: RunDir, name: str, follow: bool) -> tuple[str, str] | None:
    if not protocol.ROTATED_STREAM.fullmatch(name):
        return ("bad_argument", f"stream: {name!r} is not a rotated stream (status.<run_id>.jsonl)")
    if follow:
        return ("bad_argument", "stream: a rotated stream no longer grows; leave out --follow")
    if not (rundir.root / name).is_file():
        return ("stream_missing", f"stream: {rundir.root / name} does not exist")
    return None
