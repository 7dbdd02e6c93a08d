"""`dflash-train train`: train a DFlash drafter in the foreground (the process `launch`
starts). The options are resolved and checked here, before anything heavy is imported."""

from __future__ import annotations

import argparse
import sys

from dflash_train import protocol
from dflash_train.config import ConfigError, TrainConfig, load_config
from dflash_train.config.cli_options import add_option_arguments, given_options


def configure(parser: argparse.ArgumentParser) -> None:
    add_option_arguments(parser)


def as_namespace(config: TrainConfig) -> argparse.Namespace:
    """The flat view the training run still reads its options from."""
    values = config.values()
    return argparse.Namespace(
        **{k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    )


def settings_from_args(args: argparse.Namespace) -> dict[str, int]:
    given = {"hs_queue_depth": args.hs_queue_depth, "hs_min_ready": args.hs_min_ready}
    return {**protocol.DEFAULT_SETTINGS, **{k: v for k, v in given.items() if v is not None}}


def run(args: argparse.Namespace) -> int:
    try:
        resolved = load_config(given_options(args), config_file=args.config)
    except ConfigError as exc:
        print(f"dflash-train train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(resolved.to_json())
        return 0
    from dflash_train.trainer import train

    return train(as_namespace(resolved.config))
