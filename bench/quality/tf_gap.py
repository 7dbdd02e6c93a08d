"""Where the first draft's held-out gap sits. Run 4's drafter keeps its first draft in 55.6 %
of held-out decoding rounds but is right at slot 1 in 74 % of anchors of its training
batches. Teacher-forced per-slot accuracy and τ (every anchor of every answer, as the in-run
held-out evaluation scores it: τ is 1 + the mean leading run of right drafts) of one export on
answers it trained on and on answers it never saw tells whether the gap is the prompts (seen
against unseen, both teacher-forced) or the decoding (unseen teacher-forced against the
decoding's first-draft share and τ).

    dflash-train prepare --target-model smollm2 --prompts builtin --samples 40 \\
        --max-new-tokens 256 --batch-size 40 --out /tmp/tfgap/data
    python bench/quality/tf_gap.py --target-model smollm2 \\
        --drafter bench/results/quality_smollm2/export --data-dir /tmp/tfgap/data \\
        --out tf_gap.json

The data dir's samples are the seen set (built-in train-split prompts: run 4 trained on their
greedy answers) and its heldout.jsonl the unseen one (the built-in eval split, the prompts
`eval` decodes); `--unseen NAME=DIR` adds the held-out or samples of other prepared dirs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dflash_train.checkpoint.export import load_any_drafter
from dflash_train.data.dataset import load_dataset_dir
from dflash_train.data.heldout import heldout_path, load_heldout
from dflash_train.decode.heldout_figures import teacher_forced
from dflash_train.model.dflash_loss import tau_from_slot_acc
from dflash_train.targets.frozen_target import load_target


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-model", required=True)
    p.add_argument("--drafter", required=True, help="an export, checkpoint or run dir")
    p.add_argument("--data-dir", required=True, help="samples: seen; heldout.jsonl: unseen")
    p.add_argument("--unseen", action="append", default=[], metavar="NAME=DIR",
                   help="another prepared dir's samples, scored as unseen")  # fmt: skip
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


Rows = list[tuple[list[int], list[int]]]


def dataset_rows(path: str) -> Rows:
    data = load_dataset_dir(path)
    return [(ids.tolist(), mask.tolist()) for ids, mask in data.rows(range(len(data)))]


def heldout_rows(path: str) -> Rows:
    return [(list(ids), list(mask)) for ids, mask in load_heldout(str(heldout_path(path))).rows]


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    target = load_target(args.target_model, device, torch.float32)
    drafter = load_any_drafter(args.drafter, device, torch.float32).eval()
    sets: dict[str, Rows] = {
        "seen (built-in train split: trained on)": dataset_rows(args.data_dir),
        "unseen (its held-out set)": heldout_rows(args.data_dir),
    }
    for spec in args.unseen:
        name, _, path = spec.partition("=")
        sets[f"unseen ({name})"] = dataset_rows(path)
    result: dict[str, Any] = {
        "target": args.target_model,
        "drafter": args.drafter,
        "block_size": drafter.config.block_size,
        "sets": {},
    }
    for name, rows in sets.items():
        began = time.monotonic()
        acc, tau = teacher_forced(target, drafter, rows, args.max_length)
        answer_tokens = sum(sum(mask) for _, mask in rows)
        result["sets"][name] = {
            "rows": len(rows),
            "answer_tokens": answer_tokens,
            "slot_acc": [round(a, 4) for a in acc],
            "tau_tf": None if tau is None else round(tau, 4),
            # what tau_tf read before 2026-12-06: the slots' accuracies multiplied, which
            # reads low where misses come together (dflash_loss.tau_from_slot_acc)
            "tau_tf_slot_product": round(tau_from_slot_acc(acc), 4) if acc else None,
            "seconds": round(time.monotonic() - began, 1),
        }
        first = f"{acc[0]:.1%}" if acc else "-"
        print(f"{name}: {len(rows)} rows, slot 1 {first}, tau_tf {tau}", file=sys.stderr)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
