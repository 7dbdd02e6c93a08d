"""`dflash-train gpus`: NVML readings of this box's GPUs as one JSON reply, or with
`--follow` one `gpu` status line per interval until stdout closes."""

from __future__ import annotations

import argparse
import os
import sys
import time

from dflash_train import protocol
from dflash_train.protocol import GPUS_RUN_ID


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--follow", action="store_true", help="keep sampling")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.control.tail import output_closed
    from dflash_train.gpu_telemetry import sample_gpus

    if args.interval <= 0:
        error = f"interval: {args.interval} must be above 0 seconds"
        print_reply(protocol.reply_error("gpus", "bad_argument", error))
        return 2
    if not args.follow:
        print_reply(protocol.reply_ok("gpus", **sample_gpus()))
        return 0
    out = sys.stdout.buffer
    seq = 0
    try:
        while True:
            line = protocol.encode_line("gpu", seq=seq, run=GPUS_RUN_ID, **sample_gpus())
            out.write(line.encode("utf-8"))
            out.flush()
            seq += 1
            deadline = time.monotonic() + args.interval
            while time.monotonic() < deadline:
                if output_closed(out.fileno()):
                    return 0
                time.sleep(min(0.25, args.interval))
    except (BrokenPipeError, KeyboardInterrupt):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
