"""`dflash-train logs RUN_DIR [--lines N] [--follow]`: the run's train.log as plain text,
the last N lines first, then (with --follow) new lines as they come, like `tail -F`:
truncation and rotation are survived, every line is cut to a bounded length."""

from __future__ import annotations

import argparse
import os
import sys
import time

from dflash_train import protocol
from dflash_train.rundir import RunDir

MAX_LINES = 100_000


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument(
        "--lines", type=int, default=200, metavar="N", help="last lines sent first (default 200)"
    )
    parser.add_argument("--follow", action="store_true", help="keep sending new lines")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between file checks")


def _problem(args: argparse.Namespace, rundir: RunDir) -> tuple[str, str] | None:
    if not rundir.root.is_dir():
        return "run_dir_missing", f"run_dir: {rundir.root} is not a directory"
    if not 0 <= args.lines <= MAX_LINES:
        return "bad_argument", f"lines: {args.lines} is out of range 0..{MAX_LINES}"
    if not args.poll > 0:
        return "bad_argument", f"poll: {args.poll} must be above 0 seconds"
    if not args.follow and not rundir.log.is_file():
        return "no_log", f"run_dir: {rundir.log} does not exist yet (nothing launched here)"
    return None


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.control.logs import LogFollower, last_lines
    from dflash_train.control.tail import output_closed

    rundir = RunDir.at(args.run_dir)
    problem = _problem(args, rundir)
    if problem is not None:
        print_reply(protocol.reply_error("logs", *problem))
        return 2 if problem[0] == "bad_argument" else 1
    out = sys.stdout.buffer
    try:
        lines, offset = last_lines(rundir.log, args.lines) if rundir.log.is_file() else ([], 0)
        if lines:
            out.write(b"\n".join(lines) + b"\n")
        out.flush()
        follower = LogFollower(rundir.log, offset=offset)
        while args.follow:
            new = follower.poll()
            if new:
                out.write(b"\n".join(new) + b"\n")
                out.flush()
                continue
            if output_closed(out.fileno()):
                return 0
            time.sleep(args.poll)
    except (BrokenPipeError, KeyboardInterrupt):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0
