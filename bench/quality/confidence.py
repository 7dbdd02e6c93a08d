"""Where drafts fail, against how sure the target is. Every anchor of every held-out answer,
teacher-forced as the in-run evaluation scores it: each slot's draft is right when it is the
target's greedy token, and that token was picked with some margin. Bucketed by the target's
own probability of the token it picked (at the position before the label), this says how
much of the drafter's shortfall sits where the target itself hesitates: a drafter of a
sixth of the target's depth cannot be expected to find a greedy pick the target made at
p 0.3, and a small target hesitates often.

    dflash-train prepare --target-model smollm2 --prompts builtin --samples 8 --heldout 40 \\
        --max-new-tokens 256 --batch-size 48 --out /tmp/conf/data
    python bench/quality/confidence.py --target-model smollm2 \\
        --drafter bench/results/quality_smollm2/export --data-dir /tmp/conf/data --out conf.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dflash_train.checkpoint.export import load_any_drafter
from dflash_train.data.heldout import heldout_path, load_heldout
from dflash_train.decode.speculative import with_block_size
from dflash_train.model.dflash_loss import every_anchor
from dflash_train.targets.frozen_target import extract_context, load_target

# Upper edges of the buckets of the target's probability of its own greedy pick.
EDGES = (0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-model", required=True)
    p.add_argument("--drafter", required=True, help="an export, checkpoint or run dir")
    p.add_argument("--data-dir", required=True, help="a prepared dir: its heldout.jsonl")
    p.add_argument("--device", default="cpu")
    p.add_argument("--anchors-per-pass", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def bucket(p: float) -> int:
    return next(i for i, edge in enumerate(EDGES) if p <= edge)


@torch.no_grad()
def score_row(
    target: Any, drafter: Any, ids: list[int], mask: list[int], per_pass: int
) -> list[tuple[list[bool], list[float]]]:
    """Per anchor: each slot's draft right or not, and the target's probability of the
    slot's label (its greedy pick) at the position before it."""
    size = drafter.config.block_size
    seq = torch.tensor([ids], device=target.device)
    loss_mask = torch.tensor([mask], device=target.device)
    lengths = torch.tensor([len(ids)], device=target.device)
    hidden = target.backbone(input_ids=seq).last_hidden_state
    probs = torch.softmax(target.lm_head(hidden).float(), dim=-1)[0]  # [S, V]
    picked = probs.gather(1, torch.tensor([*ids[1:], 0], device=target.device)[:, None])[:, 0]
    context = extract_context(target, seq, None, list(drafter.config.target_layer_ids))
    count = int((loss_mask[:, :-1].bool() & loss_mask[:, 1:].bool()).sum())
    anchors, valid = every_anchor(loss_mask, lengths, size, max(count, 1))
    out: list[tuple[list[bool], list[float]]] = []
    for first in range(0, anchors.shape[1], per_pass):
        a, v = anchors[:, first : first + per_pass], valid[:, first : first + per_pass]
        if not bool(v.any()):
            continue
        embeds = drafter.embed_blocks(target.embed_tokens, seq.gather(1, a))
        h = drafter(embeds, context, a, v).view(1, a.shape[1], size, -1)[:, :, 1:]
        drafts = target.lm_head(h).argmax(dim=-1)[0]  # [N, size-1]
        for n in range(a.shape[1]):
            if not bool(v[0, n]):
                continue
            anchor = int(a[0, n])
            slots = [
                anchor + j for j in range(1, size) if anchor + j < len(ids) and mask[anchor + j]
            ]
            right = [int(drafts[n, j - 1 - anchor]) == ids[j] for j in slots]
            sure = [float(picked[j - 1]) for j in slots]
            out.append((right, sure))
    return out


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    target = load_target(args.target_model, device, torch.float32)
    # dense-mask attention, as the in-run teacher-forced pass runs it: any row length
    drafter = with_block_size(load_any_drafter(args.drafter, device, torch.float32).eval(), None)
    rows = load_heldout(str(heldout_path(args.data_dir))).rows
    began = time.monotonic()
    blocks: list[tuple[list[bool], list[float]]] = []
    for ids, mask in rows:
        blocks += score_row(target, drafter, list(ids), list(mask), args.anchors_per_pass)
    # Slot 1 of every block, and slot j only where slots 1..j-1 were right (what a round
    # reaches), each by the target's probability of the label.
    first = [[0, 0] for _ in EDGES]
    reached = [[0, 0] for _ in EDGES]
    every = [[0, 0] for _ in EDGES]
    for right, sure in blocks:
        if right:
            first[bucket(sure[0])][0] += right[0]
            first[bucket(sure[0])][1] += 1
        for j, (ok, p) in enumerate(zip(right, sure, strict=True)):
            every[bucket(p)][0] += ok
            every[bucket(p)][1] += 1
            if all(right[:j]):
                reached[bucket(p)][0] += ok
                reached[bucket(p)][1] += 1
    lows = [0.0, *EDGES[:-1]]
    table = []
    for i, edge in enumerate(EDGES):
        row: dict[str, Any] = {"target_p": f"({lows[i]:.2f}, {edge:.2f}]"}
        for name, counts in (("slot1", first), ("reached", reached), ("every_slot", every)):
            right, total = counts[i]
            row[f"{name}_share"] = round(total / max(1, sum(c[1] for c in counts)), 4)
            row[f"{name}_acc"] = round(right / total, 4) if total else None
        table.append(row)
    runs = [next((j for j, ok in enumerate(r) if not ok), len(r)) for r, _ in blocks]
    result = {
        "target": args.target_model,
        "drafter": args.drafter,
        "rows": len(rows),
        "blocks": len(blocks),
        "tau_tf": round(1 + sum(runs) / max(1, len(runs)), 4),
        "slot1_acc": round(sum(r[0] for r, _ in blocks if r) / max(1, len(blocks)), 4),
        "buckets": table,
        "seconds": round(time.monotonic() - began, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in table:
        print(json.dumps(row), file=sys.stderr)
    print(f"tau_tf {result['tau_tf']}, slot 1 {result['slot1_acc']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
