"""The real SmolLM2 target's decoder layers compiled as a GPU run compiles them
(`compile_target_layers`, inductor, then the trainer's warm-up), against the same layers
eager, on padded batches of shapes the warm-up never saw: how many graphs, whether any graph
broke, whether a later shape compiled again, and how far the context features differ on the
real (unpadded) tokens. A check on the CPU before a GPU call turns the compile on for the
quality runs (bench/README.md), which have trained eager since run 1.

    OMP_NUM_THREADS=2 python bench/quality/target_compile_check.py --out check.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

LAYER_IDS = [1, 8, 14, 20, 27]  # the quality runs' context layers
VOCAB = 49_000  # below SmolLM2's 49,152: any token id is a real one


def padded_batch(rows: int, length: int, cut: dict[int, int], seed: int) -> tuple[Any, Any]:
    """Random token ids, and a mask whose row r ends at cut[r] (right padding, as collate)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    for row, end in cut.items():
        mask[row, end:] = 0
    return ids, mask


def check(target_spec: str) -> dict[str, Any]:
    import torch
    from torch._dynamo.utils import counters

    from dflash_train.pipeline.target_workers import compile_target_layers, warm_up_target
    from dflash_train.targets.frozen_target import extract_context, load_target

    target = load_target(target_spec, "cpu", torch.float32)
    batches = [padded_batch(3, 200, {1: 150, 2: 90}, 0), padded_batch(5, 333, {4: 100}, 1)]
    with torch.no_grad():
        eager = [extract_context(target, ids, mask, LAYER_IDS) for ids, mask in batches]
    compiled = compile_target_layers(target, LAYER_IDS)
    warm_up_s = warm_up_target(target, LAYER_IDS)
    graphs = counters["stats"]["unique_graphs"]
    shapes = []
    with torch.no_grad():
        for (ids, mask), reference in zip(batches, eager, strict=True):
            began = time.monotonic()
            got = extract_context(target, ids, mask, LAYER_IDS)
            real = mask.bool()
            shapes.append({
                "shape": list(ids.shape),
                "seconds": round(time.monotonic() - began, 2),
                "max_abs_diff": (got - reference)[real].abs().max().item(),
                "max_abs": reference[real].abs().max().item(),
            })  # fmt: skip
    return {
        "target": target_spec,
        "dtype": "float32",
        "device": "cpu",
        "layer_ids": LAYER_IDS,
        "layers_compiled": compiled,
        "warm_up_s": round(warm_up_s, 1),
        "graphs_after_warm_up": graphs,
        "graphs_after_new_shapes": counters["stats"]["unique_graphs"],
        "graph_breaks": dict(counters["graph_break"]),
        "new_shapes": shapes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-model", default="smollm2")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = check(args.target_model)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
