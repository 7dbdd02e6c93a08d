"""Does the recipe or the training signal hold tau down? Trains a drafter directly on the
DFlash loss over target-generated answers and prints its teacher-forced per-slot accuracy
next to what simpler predictors reach on the same anchors: an n-gram table "anchor token ->
token at anchor+j" fitted on the same data (what slot j gets from the anchor token alone).
A drafter below the table on slot 1 is not using its inputs; far above it, it uses the
target's context. Usage (CPU is fine at small sizes):

    python bench/quality/signal_probe.py --prompts 64 --max-new-tokens 128 --steps 300
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch


def ngram_accuracy(rows: list[tuple[list[int], list[int]]], block: int) -> list[float]:
    """Slot j's accuracy of predicting token[t+j] from token[t] by the most frequent follower
    (in-sample: an upper bound for a table), over anchors t with loss_mask[t] and [t+1]."""
    accs = []
    for j in range(1, block):
        table: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
        pairs = []
        for ids, mask in rows:
            for t in range(len(ids) - j):
                if mask[t] and mask[t + 1] and mask[t + j]:
                    table[ids[t]][ids[t + j]] += 1
                    pairs.append((ids[t], ids[t + j]))
        best = {k: c.most_common(1)[0][0] for k, c in table.items()}
        accs.append(sum(best[a] == b for a, b in pairs) / max(len(pairs), 1))
    return accs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    from dflash_train.data.generation import generate_rows
    from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
    from dflash_train.data.prompts import load_prompts
    from dflash_train.decode.cached_target import CachedTarget
    from dflash_train.model.dflash_loss import (
        dflash_forward_loss,
        sample_anchors,
        tau_from_sums,
    )
    from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
    from dflash_train.targets.frozen_target import extract_context, load_target

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    target = load_target("smollm2", args.device, dtype)
    stops = stop_token_ids(target)
    prompts = [chat_prompt_ids(target.tokenizer, p) for p in load_prompts("builtin")]
    prompts = sorted(prompts[: args.prompts], key=len)
    started = time.monotonic()
    answers = []
    runner = CachedTarget(target)
    for i in range(0, len(prompts), 32):
        answers += generate_rows(
            runner, prompts[i : i + 32], max_new_tokens=args.max_new_tokens, stop_ids=stops
        )
    rows = [(p + a, [0] * len(p) + [1] * len(a)) for p, a in zip(prompts, answers, strict=True)]
    truncated = sum(a[-1] not in stops for a in answers)
    print(
        f"data: {len(rows)} answers, {sum(map(len, answers))} tokens, {truncated} truncated, "
        f"{time.monotonic() - started:.0f}s",
        file=sys.stderr,
    )
    table = ngram_accuracy(rows, args.block_size)
    print(json.dumps({"ngram_slot_acc": [round(a, 3) for a in table]}), flush=True)

    config = drafter_config_for_target(target, num_layers=args.layers, block_size=args.block_size)
    drafter = DFlashDrafter(config).to(args.device).train()
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=0.01)
    contexts = []
    for ids, mask in rows:
        seq = torch.tensor([ids], device=args.device)
        ctx = extract_context(target, seq, None, config.target_layer_ids)
        contexts.append((seq, torch.tensor([mask], device=args.device), ctx.float().clone()))
    generator = torch.Generator(device=args.device).manual_seed(0)
    sums = torch.zeros(4, args.block_size - 1)  # LossOutput.slot_sums
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        picks = torch.randint(len(contexts), (args.batch,)).tolist()
        for k in picks:
            seq, mask, ctx = contexts[k]
            anchors, valid = sample_anchors(mask, args.anchors, args.block_size, generator)
            out = dflash_forward_loss(
                drafter, target.embed_tokens, target.lm_head, ctx, seq, mask, anchors, valid
            )
            (out.loss / args.batch).backward()
            sums += out.slot_sums().detach().cpu()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0:
            acc = (sums[0] / sums[1].clamp_min(1)).tolist()
            record = {
                "step": step,
                "loss": round(float(out.loss), 3),
                "slot_acc": [round(a, 3) for a in acc],
            }
            record["tau_tf"] = round(tau_from_sums(sums), 3)
            print(json.dumps(record), flush=True)
            sums.zero_()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
