"""`dflash-train stop RUN_DIR [--timeout S]`: SIGTERM the run's process group, SIGKILL it
after the timeout, and report which ended it."""

from __future__ import annotations

import argparse
import signal

from dflash_train import protocol
from dflash_train.rundir import RunDir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before SIGKILL (default 60)"
    )


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.control.stop import stop_run

    # A dropped SSH channel must not end us between SIGTERM and the SIGKILL escalation.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if not args.timeout > 0:
        error = f"timeout: {args.timeout} must be above 0 seconds"
        reply = protocol.reply_error("stop", "bad_argument", error)
    else:
        reply = stop_run(RunDir.at(args.run_dir), timeout_s=args.timeout)
    print_reply(reply)
    return 0 if reply.ok else 1
