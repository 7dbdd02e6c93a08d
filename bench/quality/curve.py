"""Held-out tau of every checkpoint of a run (real speculative decoding, speculative side
only: tau needs no greedy baseline), for the loss/tau curve. One target load for all.

    python bench/quality/curve.py RUN_DIR --prompts 10 --max-new-tokens 128 --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--target-model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=60.0, help="stop after this long")
    args = parser.parse_args()
    import torch

    from dflash_train.checkpoint.export import load_any_drafter
    from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
    from dflash_train.data.prompts import load_prompts
    from dflash_train.decode.speculative import (
        Decoder,
        cached_drafter,
        speculative_decode,
        with_block_size,
    )
    from dflash_train.targets.frozen_target import load_target

    started = time.monotonic()
    target = load_target(args.target_model, args.device, torch.float32)
    stops = stop_token_ids(target)
    prompts = [chat_prompt_ids(target.tokenizer, p) for p in load_prompts("builtin", "eval")]
    prompts = prompts[: args.prompts]
    # checkpoints/<run id>/step_N (or checkpoints/step_N in older run dirs), by step
    found = (Path(args.run_dir) / "checkpoints").glob("**/step_*")
    checkpoints = sorted((p for p in found if p.is_dir()), key=lambda p: p.name)
    decoder = None
    points = []
    # Newest first, so the figure that matters is measured even if the budget runs out.
    for checkpoint in reversed(checkpoints):
        if time.monotonic() - started > args.budget_s:
            break
        try:
            drafter = load_any_drafter(checkpoint, args.device, torch.float32).eval()
            drafter = with_block_size(drafter, None)  # sdpa: no compile per context length
        except (ValueError, OSError) as exc:
            print(f"curve: {checkpoint.name}: {exc}", file=sys.stderr)
            continue
        if decoder is None:
            size = drafter.config.block_size
            capacity = max(map(len, prompts)) + args.max_new_tokens + size + 1
            decoder = Decoder(target, capacity, drafter.config.target_layer_ids)
        lengths = []
        runner = cached_drafter(decoder, drafter)
        for p in prompts:
            lengths += speculative_decode(
                decoder, drafter, p, args.max_new_tokens, stops, runner
            ).block_lengths
        step = int(checkpoint.name.split("_")[-1])
        points.append({"step": step, "tau": round(sum(lengths) / max(len(lengths), 1), 4)})
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "prompts": len(prompts),
                "max_new_tokens": args.max_new_tokens,
                "points": sorted(points, key=lambda p: p["step"]),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
