"""`dflash-train train`: train a DFlash drafter in the foreground (the process `launch`
starts). The options are resolved and checked here, before anything heavy is imported."""

from __future__ import annotations

import argparse
import sys

from dflash_train.config import ConfigError, load_config
from dflash_train.config.cli_options import add_option_arguments, given_options


def configure(parser: argparse.ArgumentParser) -> None:
    add_option_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        resolved = load_config(given_options(args), config_file=args.config)
    except ConfigError as exc:
        print(f"dflash-train train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(resolved.to_json())
        return 0
    from dflash_train.training.process import train

    return train(resolved.config)
