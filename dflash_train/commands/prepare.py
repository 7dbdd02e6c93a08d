"""`dflash-train prepare`: the target answers the prompts; writes a tokenized dataset and
prints one JSON reply (progress goes to stderr, and with --run-dir to the status stream).
Its flags are generated from the option table (config/prepare_config.py)."""

from __future__ import annotations

import argparse
import logging

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


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.config.prepare_config import PrepareError, from_words
    from dflash_train.data.prepare import prepare_dataset
    from dflash_train.data.prompts import PromptError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    given = {k: v for k, v in vars(args).items() if k in OPTIONS and v is not False}
    try:
        config = from_words(given)
        info = prepare_dataset(config)
    except (PrepareError, PromptError) as exc:
        print_reply(protocol.reply_error("prepare", "bad_argument", str(exc)))
        return 2
    out = str(config.out.absolute())
    print_reply(protocol.reply_ok("prepare", out=out, **info))
    return 0
