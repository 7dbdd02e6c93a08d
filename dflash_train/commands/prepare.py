"""`dflash-train prepare`: the target answers the prompts; writes a tokenized dataset and
prints one JSON reply (progress goes to stderr, and with --run-dir to the status stream).
Its flags are generated from the option table (config/prepare_config.py)."""

from __future__ import annotations

import argparse
import logging

from dflash_train import protocol

# The flags live in config/prepare_cli.py: `launch --prepare` checks a prepare's words there
# without importing a command.
from dflash_train.config.prepare_cli import add_prepare_arguments, given_options


def configure(parser: argparse.ArgumentParser) -> None:
    add_prepare_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.config.prepare_config import PrepareError, PrepareStopped, from_words
    from dflash_train.data.prepare import prepare_dataset
    from dflash_train.data.prompts import PromptError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = from_words(given_options(args))
        info = prepare_dataset(config)
    except PrepareStopped as exc:
        print_reply(protocol.reply_error("prepare", "stopped", str(exc)))
        return 128 + exc.signum  # as a shell reports a process the signal ended
    except (PrepareError, PromptError) as exc:
        print_reply(protocol.reply_error("prepare", "bad_argument", str(exc)))
        return 2
    out = str(config.out.absolute())
    print_reply(protocol.reply_ok("prepare", out=out, **info))
    return 0
