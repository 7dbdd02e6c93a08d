"""`dflash-train prepare`: the target answers the prompts; writes a tokenized dataset and
prints one JSON reply (progress goes to stderr)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dflash_train import protocol


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-model", required=True, help="HF model dir, 'smollm2', or 'random:<preset>'"
    )
    parser.add_argument(
        "--prompts", required=True, help="'builtin' (train split), a .txt or a .jsonl file"
    )
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to write")
    parser.add_argument(
        "--samples", type=int, help="samples to write (default: one per prompt; more cycles)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--num-shards", type=int, default=1, help="Arrow files to split into")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing dataset directory"
    )


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.data.prepare import PrepareConfig, PrepareError, prepare_dataset
    from dflash_train.data.prompts import PromptError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = PrepareConfig(
        target=args.target_model,
        prompts=args.prompts,
        out=args.out,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        temperature=args.temperature,
        seed=args.seed,
        device=args.device,
        num_shards=args.num_shards,
        overwrite=args.overwrite,
    )
    try:
        info = prepare_dataset(config)
    except (PrepareError, PromptError) as exc:
        print_reply(protocol.reply_error("prepare", "bad_argument", str(exc)))
        return 2
    out = str(args.out.absolute())
    print_reply(protocol.reply_ok("prepare", out=out, **info))
    return 0
