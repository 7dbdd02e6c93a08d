"""Where the target stage's time goes (issue 28, goal 1: the compiled hybrid reached 12.2
Ktok/s of the 14 asked on an H100). One forward of a target preset, compiled as the trainer
compiles it (compile_target_layers), in bf16 or fp8, timed as bench/target_stage.py times it,
then a few forwards under torch.profiler. Writes the chrome trace and a summary: device
kernel time per category (matmul; attention, the full-attention layers' SDPA; the
linear-attention kernels, gated_delta_rule and conv1d, told by the opaque op that launched
them, targets/kernel_ops.py; fp8_scaling, the activations' amax and cast; norm; elementwise;
memcpy_memset; other), the top kernels, the idle gap and the useful-FLOP share by
target_stage.py's count.

One GPU: `PYTHONPATH=$PWD:$PWD/bench python bench/profile_target.py --out DIR [--fp8]`. On a
CPU (`--device cpu --smoke`): tiny-hybrid eager, CPU ops' self time standing in for kernels;
with `--fp8 --allow-cpu-fp8`, torchao's quantisation with its hardware check lifted (as
bench/fp8_fidelity.py does) on the target in bf16: the fp8 path's plumbing, not its speed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from pipeline import build_target
from profile_drafter import (
    ELEMENTWISE_OPS,
    ELEMENTWISE_WORDS,
    GEMM_WORDS,
    MATMUL_OPS,
    Item,
    _bare,
    pack_trace,
    print_categories,
    print_top,
    read_trace,
    record,
    summarise,
    union_us,
    write_result,
)
from speed_drafter import log
from speed_suite import time_target
from target_stage import useful_flops_per_token

from dflash_train.targets import linear_attention as la
from dflash_train.targets.frozen_target import (
    context_layer_count,
    extract_context,
    target_layer_ids,
)

CATEGORIES = (
    "matmul", "attention", "gated_delta_rule", "conv1d", "fp8_scaling", "norm", "elementwise",
    "memcpy_memset", "other",
)  # fmt: skip
# The opaque ops' names as the profiler records them (kernel_ops.py registers them).
OPAQUE = {"dflash::chunk_gated_delta_rule": "gated_delta_rule", "dflash::causal_conv1d": "conv1d"}
ATTENTION_WORDS = (
    "flash", "fmha", "scaled_dot_product", "sdpa", "efficient_attention", "cudnn_attention",
)  # fmt: skip
FP8_WORDS = ("amax", "float8", "e4m3", "to_fp8", "_scaled")
NORM_WORDS = ("rms_norm", "rmsnorm", "rsqrt")


def categorise(item: Item) -> str:
    """A kernel's (or CPU op's) category. The opaque ops come first: whatever the linear-
    attention kernels run inside them (fla's matmuls included) is theirs."""
    name, context, launcher = item.name.lower(), item.context, _bare(item.launcher)
    if item.device_cat in ("gpu_memcpy", "gpu_memset") or "memcpy" in name or "memset" in name:
        return "memcpy_memset"
    for op, cat in OPAQUE.items():
        if op in context or op in name:
            return cat
    # Attention before matmul: cuDNN's attention kernels carry "wgmma" in their names.
    if any(w in name or w in launcher for w in ATTENTION_WORDS):
        return "attention"
    if any(w in name for w in GEMM_WORDS) or launcher in MATMUL_OPS | {"_scaled_mm"}:
        return "matmul"
    if any(w in name or w in launcher for w in FP8_WORDS):
        return "fp8_scaling"
    if any(w in name or w in context for w in NORM_WORDS):
        return "norm"
    if any(w in name for w in ELEMENTWISE_WORDS) or launcher in ELEMENTWISE_OPS:
        return "elementwise"
    if name.startswith("triton_"):  # inductor's fused pointwise and reductions
        return "elementwise"
    return "other"


def profile_target(args: argparse.Namespace) -> dict[str, Any]:
    # "cuda" alone has no index, which set_device refuses: the first GPU is the stage's.
    device = torch.device("cuda:0" if args.device == "cuda" else args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    target = build_target(args.target, device)
    converted = None
    if args.fp8:
        from dflash_train.targets.fp8 import quantise_target_fp8

        if device.type == "cpu":  # rowwise float8 takes bf16 weights; the CPU builds fp32
            target.model.to(torch.bfloat16)
        converted = quantise_target_fp8(target)
    # The kernels behind the opaque ops eager too, so the profile tells them apart.
    la.make_kernels_opaque(target.model)
    layer_ids = target_layer_ids(target.num_layers, context_layer_count(target.num_layers, None))
    log(f"{args.target} {args.rows}x{args.seq}: compile and time ({args.calls} calls)")
    timing = time_target(target, args.rows, args.seq, args.calls, args.compiled)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (args.rows, args.seq), device=device, generator=gen)
    mask = torch.ones_like(ids)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.out / f"trace_target_{args.tag}.json"
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    log(f"profiling {args.steps} forwards")
    record(lambda: extract_context(target, ids, mask, layer_ids), device, args.steps, trace)
    graphs = counters["stats"]["unique_graphs"] - graphs
    kernels, ops, step_walls = read_trace(json.loads(trace.read_text())["traceEvents"])
    on_device = device.type == "cuda"
    per_token, flop_text = useful_flops_per_token(target, args.seq)
    flops = per_token * args.rows * args.seq
    summary = summarise(
        kernels if on_device else ops, step_walls, timing["ms_per_step"], flops,
        categorise=categorise, categories=CATEGORIES,
    )  # fmt: skip
    trace = pack_trace(trace)
    return {
        "target": args.target,
        "device": torch.cuda.get_device_name(device) if on_device else "cpu",
        "torch": torch.__version__,
        "shape": {"rows": args.rows, "seq": args.seq},
        "compiled": args.compiled,
        "target_dtype": "fp8" if args.fp8 else str(next(target.model.parameters()).dtype),
        "fp8_linears": converted,
        "layer_paths": la.layer_paths(target),
        "steps_profiled": len(step_walls),
        "measure": "CUDA kernels" if on_device else "CPU op self time (no device)",
        "step_ms": timing["ms_per_step"],
        "timing": timing,
        **summary,
        "graphs_compiled_while_profiled": graphs,
        "host_op_ms_per_step": round(union_us(ops) / max(1, len(step_walls)) / 1e3, 3),
        "flop_count": flop_text,
        "trace": trace.name,
        "trace_bytes": trace.stat().st_size,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['target']} {result['shape']['rows']}x{result['shape']['seq']} "
          f"{result['target_dtype']}, {'compiled' if result['compiled'] else 'eager'}: "
          f"{result['step_ms']} ms (profiled {result['profiled_step_ms']} ms), "
          f"{result['measure']}")  # fmt: skip
    print_categories(result, width=17)
    print(f"  useful-FLOP share of the step {result['useful_share_of_step']:.1%}")
    print_top(result, width=17)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="random:qwen3.5-27b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--smoke", action="store_true", help="random:tiny-hybrid 2x128, eager")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--eager", action="store_true", help="the layers uncompiled")
    p.add_argument("--fp8", action="store_true", help="torchao float8 linears (CUDA)")
    p.add_argument("--allow-cpu-fp8", action="store_true", help="--fp8 on a CPU: plumbing only")
    p.add_argument("--calls", type=int, default=3, help="timed forwards")
    p.add_argument("--steps", type=int, default=2, help="profiled forwards")
    p.add_argument("--out", type=Path, default=Path("profile_target"))
    p.add_argument("--tag", default="", help="names the outputs (default: dtype and mode)")
    a = p.parse_args(argv)
    if a.fp8 and a.device != "cuda":
        if not a.allow_cpu_fp8:
            p.error("--fp8: torchao's float8 matmuls need a CUDA GPU (--allow-cpu-fp8: plumbing)")
        import torchao.quantization.quant_api as quant_api

        from dflash_train.targets import fp8 as fp8_module

        quant_api._check_hardware_support = lambda *_: None
        fp8_module.fp8_refusal = lambda _device: None  # type: ignore[assignment]
    if a.smoke:
        a.target, a.rows, a.seq, a.eager, a.calls = "random:tiny-hybrid", 2, 128, True, 1
    a.compiled = not a.eager
    dtype = "fp8" if a.fp8 else ("bf16" if a.device == "cuda" else "fp32")  # build_target's
    a.tag = a.tag or f"{dtype}_{'compiled' if a.compiled else 'eager'}"
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = profile_target(args)
    return write_result(args.out / f"profile_target_{args.tag}.json", result, print_table)


if __name__ == "__main__":
    sys.exit(main())
