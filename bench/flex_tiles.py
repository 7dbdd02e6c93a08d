"""The drafter's flex attention alone, forward and forward + backward, under several Triton
tile configurations (issue 28, goal 3). At Qwen3.6-27B dims the drafter step is 944 ms
against the 795 the goal needs, and flex's backward at head_dim 256 takes 163 ms, 6.7x its
forward (at head_dim 128 it is 3.3x). torch's default backward tiles for sm90 at head_dim
256 are 64x64 with 4 warps and 2 stages (template_heuristics/triton.py); this times the
alternatives that `kernel_options` can name (`bwd_num_warps`, `bwd_BLOCK_M1`, ...), and
inductor's max-autotune, on the trainer's own block mask (attention_layout.flex_layout over
sample_anchors' anchors), each against the default's output and gradients.

One GPU: `PYTHONPATH=$PWD:$PWD/bench python bench/flex_tiles.py --dims qwen3.6-27b --out X`.
On a CPU (`--device cpu --smoke`): tiny dims, eager flex (no kernels, so no tiles), torch's
refusal of a CPU flex backward lifted (the math backward behind it runs): the plumbing only."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from decode_speed import _sync, _timed
from speed_drafter import DIMS, log

from dflash_train.model.attention_layout import KERNEL_OPTIONS, flex_layout
from dflash_train.model.dflash_loss import sample_anchors

# name -> kernel_options on top of the trainer's (KERNEL_OPTIONS); "autotune" compiles in
# max-autotune-no-cudagraphs instead. Shared memory bounds the larger tiles at head_dim 256:
# a config that does not fit fails to compile and is reported as such.
_BWD_32X64 = {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32}
_BWD_64X128 = {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64}
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "bwd_warps8": {"bwd_num_warps": 8},
    "bwd_warps8_stages1": {"bwd_num_warps": 8, "bwd_num_stages": 1},
    "bwd_stages1": {"bwd_num_stages": 1},
    "bwd_32x64": _BWD_32X64,
    "bwd_32x64_warps8": {**_BWD_32X64, "bwd_num_warps": 8},
    "bwd_64x128_warps8": {**_BWD_64X128, "bwd_num_warps": 8, "bwd_num_stages": 1},
    "fwd_warps8": {"fwd_num_warps": 8},
    "autotune": {},
}
# speed_suite's drafter shapes: (rows, seq, anchors, block).
SHAPES = {"qwen3-8b": (8, 2048, 512, 16), "qwen3.6-27b": (4, 2048, 512, 16), "tiny": (2, 128, 8, 4)}


def inputs(dims: str, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """q, k, v at the padded lengths the trainer's _flex passes, and its block mask."""
    rows, seq, anchors, block = SHAPES[dims]
    d = DIMS[dims]
    gen = torch.Generator(device=device).manual_seed(0)
    loss_mask = torch.zeros(rows, seq, dtype=torch.long, device=device)
    loss_mask[:, seq // 4 :] = 1  # as speed_drafter's rig: the answer is the last 3/4
    picked, valid = sample_anchors(loss_mask, anchors, block, generator=gen)
    layout = flex_layout(picked, valid, seq, block)
    keys = layout.padded_context + layout.padded_queries

    def rand(heads: int, length: int) -> torch.Tensor:
        shape = (rows, heads, length, d["head_dim"])
        return torch.randn(shape, device=device, dtype=dtype, generator=gen).requires_grad_()

    return {
        "q": rand(d["heads"], layout.padded_queries),
        "k": rand(d["kv"], keys),
        "v": rand(d["kv"], keys),
        "layout": layout,
        "scale": d["head_dim"] ** -0.5,
        "shape": {
            "rows": rows,
            "seq": seq,
            "anchors": anchors,
            "block": block,
            "heads": d["heads"],
            "kv_heads": d["kv"],
            "head_dim": d["head_dim"],
            "padded_queries": layout.padded_queries,
            "keys": keys,
        },
    }


def run_config(name: str, x: dict[str, Any], repeats: int, compiled: bool) -> dict[str, Any]:
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, layout = x["q"], x["k"], x["v"], x["layout"]
    torch._dynamo.reset()
    kernel: Any = flex_attention
    options = {**KERNEL_OPTIONS, **CONFIGS[name]}
    if compiled:
        mode = "max-autotune-no-cudagraphs" if name == "autotune" else None
        kernel = torch.compile(flex_attention, dynamic=False, fullgraph=True, mode=mode)
    grad = torch.ones_like(q)

    def forward() -> torch.Tensor:
        out = kernel(
            q, k, v, block_mask=layout.block_mask, scale=x["scale"], enable_gqa=True,
            **({"kernel_options": options} if compiled else {}),
        )  # fmt: skip
        return out

    def forward_backward() -> None:
        q.grad = k.grad = v.grad = None
        forward().backward(grad)

    start = time.perf_counter()
    forward_backward()  # compiles both
    _sync(q.device)
    compile_s = time.perf_counter() - start
    with torch.no_grad():
        fwd_ms = _timed(forward, repeats, q.device)
    both_ms = _timed(forward_backward, repeats, q.device)
    out = forward().detach().float()
    q.grad = k.grad = v.grad = None
    forward().backward(grad)
    grads = [t.grad.detach().float() for t in (q, k, v)]
    return {
        "kernel_options": CONFIGS[name], "compile_s": round(compile_s, 2), "fwd_ms": fwd_ms,
        "fwd_bwd_ms": both_ms, "bwd_ms": round(both_ms - fwd_ms, 3), "_out": out,
        "_grads": grads,
    }  # fmt: skip


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", choices=sorted(SHAPES), default="qwen3.6-27b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny dims, eager flex, two configs")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--deadline", type=float, default=480.0, help="seconds for all configs")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    names = ["default", "bwd_warps8"] if a.smoke else a.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or names[0] != "default":
        p.error(f"--configs: {unknown or names[0]}: names from {list(CONFIGS)}, default first")
    dims, device = ("tiny" if a.smoke else a.dims), torch.device(a.device)
    compiled = device.type == "cuda"
    if not compiled:
        import torch.nn.attention.flex_attention as flex_module

        flex_module._validate_device = lambda *_a: None  # type: ignore[attr-defined]
    dtype = torch.bfloat16 if compiled else torch.float32
    x = inputs(dims, device, dtype)
    result: dict[str, Any] = {
        "dims": dims, "shape": x["shape"], "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name(device) if compiled else "cpu",
        "torch": torch.__version__, "compiled": compiled, "repeats": a.repeats, "configs": {},
    }  # fmt: skip
    deadline = time.monotonic() + a.deadline
    base: dict[str, Any] | None = None
    for name in names:
        if time.monotonic() > deadline:
            result["configs"][name] = {"error": "skipped: out of time (--deadline)"}
            continue
        log(f"{dims} {name} ...")
        try:
            got = run_config(name, x, a.repeats, compiled)
        except Exception as exc:  # a tile that does not fit in shared memory, say
            result["configs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            log(f"{name}: failed: {type(exc).__name__}")
            continue
        out, grads = got.pop("_out"), got.pop("_grads")
        if base is None:
            base = {"out": out, "grads": grads}
        got["max_diff_vs_default"] = {
            "out": _max_diff(out, base["out"]),
            **{
                f"grad_{t}": _max_diff(g, b)
                for t, g, b in zip("qkv", grads, base["grads"], strict=True)
            },
        }
        result["configs"][name] = got
        log(f"{name}: {json.dumps(got)}")
        a.out.write_text(json.dumps(result, indent=1) + "\n")  # as it goes
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'config':<22}{'fwd ms':>9}{'bwd ms':>9}{'compile s':>10}")
    for name, got in result["configs"].items():
        if "error" in got:
            print(f"{name:<22}{got['error'][:70]}")
        else:
            print(f"{name:<22}{got['fwd_ms']:>9.2f}{got['bwd_ms']:>9.2f}{got['compile_s']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
