"""`dflash-train prepare`: the target answers the prompts; writes a tokenized dataset and
prints one JSON reply (progress goes to stderr, and with --run-dir to the status stream).
Its flags are generated from the option table (config/prepare_config.py)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import NoReturn

from dflash_train import protocol
from dflash_train.config.prepare_config import OPTIONS


def _help(name: str) -> str:
    spec = OPTIONS[name]
    if spec.default is None or spec.kind == "bool":
        return spec.help
    return f"{spec.help} (default {spec.text(spec.default)})"


def configure(parser: argparse.ArgumentParser) -> None:
    for name, spec in OPTIONS.items():
        flag = "--target-model" if name == "target" else spec.flag
        if spec.kind == "bool":
            parser.add_argument(flag, dest=name, action="store_true", help=_help(name))
            continue
        parser.add_argument(
            flag,
            dest=name,
            action="append" if spec.repeatable else "store",
            required=spec.required,
            default=argparse.SUPPRESS,
            metavar=spec.metavar or ("|".join(spec.choices) if spec.choices else spec.kind.upper()),
            help=_help(name),
        )


class _Refused(Exception):
    pass


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def check_args(words: Sequence[str]) -> str | None:
    """Why `prepare WORDS` would be refused at once (unknown flag, bad value), or None;
    `launch --prepare` asks before it starts anything."""
    from dflash_train.config.prepare_config import PrepareError, from_words

    parser = _CheckingParser(prog="dflash-train prepare", add_help=False)
    configure(parser)
    try:
        args = parser.parse_args(list(words))
        if getattr(args, "run_dir", None) is not None:
            return "run-dir: launch sets it (RUN_DIR)"
        from_words(_given(args)).validate()
    except (_Refused, PrepareError) as exc:
        return str(exc)
    return None


def _given(args: argparse.Namespace) -> dict[str, object]:
    return {k: v for k, v in vars(args).items() if k in OPTIONS and v is not False}


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.config.prepare_config import PrepareError, from_words
    from dflash_train.data.prepare import prepare_dataset
    from dflash_train.data.prompts import PromptError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = from_words(_given(args))
        info = prepare_dataset(config)
    except (PrepareError, PromptError) as exc:
        print_reply(protocol.reply_error("prepare", "bad_argument", str(exc)))
        return 2
    out = str(config.out.absolute())
    print_reply(protocol.reply_ok("prepare", out=out, **info))
    return 0
