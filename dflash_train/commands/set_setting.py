"""`dflash-train set RUN_DIR KEY VALUE`: change a live setting of the running trainer
through control.json and report whether it applied it."""

from __future__ import annotations

import argparse

from dflash_train import protocol
from dflash_train.rundir import RunDir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    known = ", ".join(f"{s.name} ({s.help})" for s in protocol.LIVE_SETTINGS.values())
    parser.add_argument("key", metavar="KEY", help=f"one of: {known}")
    parser.add_argument("value", metavar="VALUE")
    parser.add_argument(
        "--wait", type=float, default=15.0, help="seconds to wait for the answer (default 15)"
    )


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.control.launch import ControlBusy, control_guard
    from dflash_train.control.settings import set_setting

    rundir = RunDir.at(args.run_dir)
    if not args.wait > 0:
        error = f"wait: {args.wait} must be above 0 seconds"
        reply = protocol.reply_error("set", "bad_argument", error)
    elif not rundir.root.is_dir():
        reply = protocol.reply_error(
            "set", "not_running", f"run_dir: {rundir.root} is not a directory"
        )
    else:
        try:
            with control_guard(rundir):
                reply = set_setting(rundir, args.key, args.value, wait_s=args.wait)
        except ControlBusy as exc:
            reply = protocol.reply_error("set", "busy", str(exc))
    print_reply(reply)
    return 0 if reply.ok else 1
