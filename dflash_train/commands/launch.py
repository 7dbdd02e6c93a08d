"""`dflash-train launch RUN_DIR [options] -- <train args>`: preflight, start the trainer
detached, and reply only once it is verifiably training (or with the reason it is not)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable

from dflash_train import protocol
from dflash_train.control.preflight import ArgumentError, RaisingParser
from dflash_train.rundir import RunDir

MIB = 1024 * 1024


def add_start_options(parser: argparse.ArgumentParser) -> None:
    """Options shared with `restart`."""
    parser.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for run_start (default 120)"
    )
    parser.add_argument(
        "--allow-busy", action="store_true", help="start even on GPUs other processes use"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for the trainer (repeatable); only PATH, HOME, LANG are inherited",
    )
    parser.add_argument(
        "--env-file",
        default=None,
        metavar="PATH",
        help="NAME=VALUE file on this box for the trainer (mode 0600; values never echoed)",
    )
    parser.add_argument(
        "--min-free-mb",
        type=int,
        default=None,
        help="free disk required in RUN_DIR (default: estimated from the checkpoint size)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    add_start_options(parser)
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="run `prepare` with the arguments after -- instead of train (RUN_DIR: its stream)",
    )
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="-- TRAIN_ARGS", help="the arguments of `train`"
    )


def split_rest(
    args: argparse.Namespace, add_options: Callable[[argparse.ArgumentParser], None]
) -> list[str]:
    """argparse hands everything after RUN_DIR to `rest`: options up to `--` are this
    command's (parsed into `args`), what follows `--` is passed on untouched. argparse
    drops a `--` that comes right after RUN_DIR, so a `rest` without `--` that does not
    start with one of our options is passed on whole. Raises ArgumentError."""
    rest: list[str] = list(args.rest)
    parser = RaisingParser(add_help=False)
    add_options(parser)
    if "--" in rest:
        cut = rest.index("--")
    else:
        ours = {s for action in parser._actions for s in action.option_strings}
        if rest and rest[0].split("=", 1)[0] not in ours:
            return rest
        cut = len(rest)
    parser.parse_args(rest[:cut], namespace=args)
    return rest[cut + 1 :]


def _launch_options(parser: argparse.ArgumentParser) -> None:
    add_start_options(parser)
    parser.add_argument("--prepare", action="store_true")


def print_reply(reply: protocol.Reply) -> None:
    """Print the reply; a reader that has gone (a dropped channel) loses nothing the run
    directory does not record."""
    from dflash_train.control.reply_text import with_message

    try:
        print(with_message(reply).to_json(), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def check_start_options(command: str, args: argparse.Namespace) -> protocol.Reply | None:
    if not args.wait > 0:
        return protocol.reply_error(
            command, "bad_argument", f"wait: {args.wait} must be above 0 seconds"
        )
    if args.min_free_mb is not None and args.min_free_mb < 0:
        return protocol.reply_error(
            command, "bad_argument", f"min-free-mb: {args.min_free_mb} must not be negative"
        )
    return None


def _reply(args: argparse.Namespace) -> protocol.Reply:
    from dflash_train.control.launch import launch_run, parse_env
    from dflash_train.control.preflight import PreflightError

    try:
        train_args = split_rest(args, _launch_options)
    except ArgumentError as exc:
        return protocol.reply_error("launch", "bad_argument", str(exc))
    problem = check_start_options("launch", args)
    if problem is not None:
        return problem
    try:
        env = parse_env(args.env)
    except PreflightError as exc:
        return protocol.reply_error("launch", exc.code, exc.message)
    if args.prepare:
        from dflash_train.control.launch import launch_prepare

        # `-- PREPARE_ARGS -- TRAIN_ARGS`: prepare, then train on its data in one launch.
        cut = train_args.index("--") if "--" in train_args else len(train_args)
        return launch_prepare(
            RunDir.at(args.run_dir),
            train_args[:cut],
            env=env,
            wait_s=args.wait,
            env_file=args.env_file,
            train_args=train_args[cut + 1 :] if cut < len(train_args) else None,
        )
    return launch_run(
        RunDir.at(args.run_dir),
        train_args,
        env=env,
        wait_s=args.wait,
        allow_busy=args.allow_busy,
        min_free_bytes=None if args.min_free_mb is None else args.min_free_mb * MIB,
        env_file=args.env_file,
    )


def reply_ignoring_hangup(
    make_reply: Callable[[argparse.Namespace], protocol.Reply], args: argparse.Namespace
) -> int:
    """Runs a command that starts a trainer. A dropped SSH channel must not end us
    mid-verification: a trainer hanging at start-up would be left half-alive with nobody
    to end its process group."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reply = make_reply(args)
    print_reply(reply)
    return 0 if reply.ok else 1


def run(args: argparse.Namespace) -> int:
    return reply_ignoring_hangup(_reply, args)
