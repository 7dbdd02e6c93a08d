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
    pipeline = resolved.config.pipeline
    devices = pipeline.target_gpus or pipeline.drafter_gpus or ()
    if pipeline.target_dtype == "fp8" and "cpu" in devices:
        from dflash_train.targets.fp8 import off_cuda_refusal

        # The GPU's capability and torchao are checked when the target loads.
        print(f"dflash-train train: {off_cuda_refusal('cpu')}", file=sys.stderr)
        return 2
    from dflash_train.checkpoint.layout import resume_refusal
    from dflash_train.rundir import RunDir

    # A checkpoint already at --max-steps: refused as a bad argument, before the run dir's
    # lock, its stream or any model (the run would end at once, trained and saved nothing).
    refusal = resume_refusal(
        resolved.config, RunDir.at(resolved.config.train.output_dir).checkpoints
    )
    if refusal is not None:
        print(f"dflash-train train: {refusal}", file=sys.stderr)
        return 2
    from dflash_train.training.process import train

    return train(resolved.config)
