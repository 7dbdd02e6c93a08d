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
        "--prompts",
        required=True,
        action="append",
        help="'builtin' (train split), a .txt file (a prompt a line), a .jsonl file of "
        "prompts or chat data (OpenAI messages, ShareGPT or role/content conversations), or "
        "synth:N (the target writes N prompts; synth:N@builtin or synth:N@FILE opens each with "
        "the first words of one of those prompts); end with *K to answer each K times; repeat "
        "the flag to mix sources",
    )
    parser.add_argument(
        "--responses",
        choices=("regenerate", "keep"),
        default="regenerate",
        help="regenerate (default): the target writes every assistant turn given the "
        "conversation so far; keep: the data's own assistant turns are used as they are",
    )
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to write")
    parser.add_argument(
        "--samples", type=int, help="samples to write (default: one per prompt; more cycles)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--batch-size", type=int, default=16, help="rows generated together (GPU: 512-2048)"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--num-shards", type=int, default=1, help="Arrow files to split into")
    parser.add_argument(
        "--max-seconds",
        type=float,
        help="start no new generation batch after this many seconds (load and synthesis "
        "count); the samples answered by then are written, the reply counts the rest",
    )
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
        prompts=args.prompts[0] if len(args.prompts) == 1 else tuple(args.prompts),
        out=args.out,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        temperature=args.temperature,
        seed=args.seed,
        device=args.device,
        num_shards=args.num_shards,
        overwrite=args.overwrite,
        responses=args.responses,
        max_seconds=args.max_seconds,
    )
    try:
        info = prepare_dataset(config)
    except (PrepareError, PromptError) as exc:
        print_reply(protocol.reply_error("prepare", "bad_argument", str(exc)))
        return 2
    out = str(args.out.absolute())
    print_reply(protocol.reply_ok("prepare", out=out, **info))
    return 0
