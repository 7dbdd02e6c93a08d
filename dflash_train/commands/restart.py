"""`dflash-train restart RUN_DIR [--fresh] [--set key=value ...] [-- --option VALUE ...]`:
stop the run, then start its recorded config again (resuming unless --fresh) with the
overrides applied. A bad override is refused before anything is stopped."""

from __future__ import annotations

import argparse

from dflash_train import protocol
from dflash_train.commands.launch import (
    MIB,
    add_start_options,
    check_start_options,
    reply_ignoring_hangup,
    split_rest,
)
from dflash_train.control.preflight import ArgumentError
from dflash_train.rundir import RunDir


def add_restart_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fresh", action="store_true", help="start from scratch under a new run id"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any train option for the new start (repeatable), e.g. epochs=8 or hs_min_ready=30",
    )
    parser.add_argument(
        "--stop-timeout", type=float, default=60.0, help="seconds before SIGKILL (default 60)"
    )
    add_start_options(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    add_restart_options(parser)
    parser.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="-- OPTION VALUE",
        help="train options that replace the recorded ones",
    )


def _reply(args: argparse.Namespace) -> protocol.Reply:
    from dflash_train.control.launch import parse_env
    from dflash_train.control.preflight import PreflightError
    from dflash_train.control.restart import restart_run

    try:
        overrides = split_rest(args, add_restart_options)
    except ArgumentError as exc:
        return protocol.reply_error("restart", "bad_argument", str(exc))
    problem = check_start_options("restart", args)
    if problem is not None:
        return problem
    if not args.stop_timeout > 0:
        error = f"stop-timeout: {args.stop_timeout} must be above 0 seconds"
        return protocol.reply_error("restart", "bad_argument", error)
    sets: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            return protocol.reply_error(
                "restart", "bad_override", f"set: {item!r} is not KEY=VALUE"
            )
        sets[key.strip()] = value
    try:
        env = parse_env(args.env)
    except PreflightError as exc:
        return protocol.reply_error("restart", exc.code, exc.message)
    return restart_run(
        RunDir.at(args.run_dir),
        fresh=args.fresh,
        sets=sets,
        extra_args=overrides,
        env=env,
        wait_s=args.wait,
        stop_timeout_s=args.stop_timeout,
        allow_busy=args.allow_busy,
        min_free_bytes=None if args.min_free_mb is None else args.min_free_mb * MIB,
        env_file=args.env_file,
    )


def run(args: argparse.Namespace) -> int:
    return reply_ignoring_hangup(_reply, args)
