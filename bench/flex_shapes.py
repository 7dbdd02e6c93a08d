"""The drafter's compiled flex attention over an epoch plan's batch shapes: the shapes the
main-thread warm-up runs (warm_up_shapes), the dynamo graphs each makes and its seconds,
then later plan shapes the warm-up did not run (graphs made: should be 0; ms per forward +
backward), and the same later shapes under a static graph each (the old dynamic=False
kernel), to compare step time. One GPU: `python bench/flex_shapes.py --out X.json`.

On the CPU (`--device cpu`, tiny dims) it runs the compiled path's graph capture with the
'aot_eager' backend (inductor's CPU flex kernel has no backward): graph counts only."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from speed_drafter import DrafterRig, _dtype, _sync, drafter_config, log
from torch._dynamo.utils import counters

from dflash_train.data.buckets import bucketed_batches
from dflash_train.model.attention_layout import _FlexState, compile_static_shapes
from dflash_train.pipeline.compile_warm_up import drafter_shapes, warm_up_shapes


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _run(rig: DrafterRig, shape: tuple[int, int], repeats: int) -> dict[str, Any]:
    """The first forward + backward of `shape` (graphs made, seconds), then `repeats` more
    (ms each)."""
    dtype = _dtype(rig.device)
    graphs = _graphs()
    first = rig.stepper.warm_up([shape], dtype)
    made = _graphs() - graphs
    start = time.perf_counter()
    for _ in range(repeats):
        rig.stepper.warm_up([shape], dtype)
    _sync(rig.device)
    ms = (time.perf_counter() - start) / max(1, repeats) * 1e3
    log(f"{shape}: {made} graphs, first {first:.2f} s, then {ms:.1f} ms")
    return {"shape": list(shape), "graphs": made, "first_s": round(first, 2), "ms": round(ms, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--anchors", type=int, default=512)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--tokens-per-batch", type=int, default=8192)
    parser.add_argument("--min-len", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--later", type=int, default=10, help="later plan shapes to run")
    parser.add_argument("--static", type=int, default=3, help="of those, again static")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        import torch.nn.attention.flex_attention as flex_module

        flex_module._validate_device = lambda *_a: None  # the math backward runs on the CPU
        _FlexState.cpu_backend = "aot_eager"
    dims = "qwen3-8b" if device.type == "cuda" else "tiny"
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.min_len, args.max_len + 1, size=4000)
    plan = bucketed_batches(
        lengths, tokens_per_batch=args.tokens_per_batch, epoch=0, seed=0, num_buckets=4,
        max_length=args.max_len,
    )  # fmt: skip
    picks = warm_up_shapes(lengths, plan, args.max_len, args.anchors, args.block)
    every = drafter_shapes(lengths, plan, args.max_len, count=len(plan), pad_to=1)
    padded = drafter_shapes(lengths, plan, args.max_len, count=len(plan))
    log(f"plan: {len(plan)} batches, {len(padded)} (rows, padded length) pairs; warm-up {picks}")
    config = drafter_config(dims, args.layers, args.block)
    rig = DrafterRig(config, 1, args.block * 2, args.anchors, device)
    rig.drafter.attention_backend = "flex"
    torch.compiler.reset()
    warm = [_run(rig, shape, 0) for shape in picks]
    # Later shapes: a spread of rows counts and padded lengths the warm-up did not run.
    seen = {(r, -(-n // 256)) for r, n in picks}
    later: list[tuple[int, int]] = []
    for rows, length in every:
        if (rows, -(-length // 256)) not in seen and len(later) < args.later:
            seen.add((rows, -(-length // 256)))
            later.append((rows, length))
    dynamic = [_run(rig, shape, args.repeats) for shape in later]
    compile_static_shapes()  # the old kernel: one static graph per shape
    static = [_run(rig, shape, args.repeats) for shape in later[: args.static]]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dims": dims,
        "layers": args.layers,
        "plan": {
            "batches": len(plan),
            "padded_pairs": len(padded),
            "tokens_per_batch": args.tokens_per_batch,
            "lengths": [args.min_len, args.max_len],
        },
        "warm_up": warm,
        "warm_up_s": round(sum(w["first_s"] for w in warm), 2),
        "later_dynamic": dynamic,
        "later_graphs": sum(d["graphs"] for d in dynamic),
        "later_static": static,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
