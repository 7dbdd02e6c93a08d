"""The target stage on one GPU (issue 28): the hybrid `random:qwen3.5-27b` 4x2048 on the
pure-PyTorch fallback, on fla's gated delta rule with the reference conv1d (what the users'
run had), on fla with fla's Triton conv1d (the fast path), the fast path compiled, and the
fast path in fp8 (torchao float8, rowwise) compiled; `random:qwen3-8b` 8x2048 bf16 compiled
against fp8 eager and compiled. One model build per target; the variants swap the kernels in
the modeling module (targets/linear_attention.py) or quantise in place (fp8 last). Compiled
cases compile as the trainer does (compile_target_layers: a hybrid's linear-attention kernels
behind opaque ops, targets/kernel_ops.py) and report compile_s and the dynamo graphs, frames
and graph breaks the case added.

    PYTHONPATH=$PWD:$PWD/bench python bench/target_stage.py --out /tmp/target_stage.json

MFU counts useful FLOPs: 2 x the parameters of the layers run per token, plus causal
attention (2 x 2 x S/2 x heads x head_dim per token) on the full-attention layers only; the
gated delta rule's own arithmetic is not counted. Peak: 989 TFLOP/s (dense bf16 datasheet)
for bf16 and fp8 cases alike, so an fp8 case's MFU is comparable with its bf16 twin."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pipeline import build_target
from speed_suite import time_target

from dflash_train.pipeline.target_workers import uncompile_target_layers
from dflash_train.targets import linear_attention as la
from dflash_train.targets.fp8 import quantise_target_fp8
from dflash_train.targets.frozen_target import Target, context_layer_count, target_layer_ids

PEAK = 989e12


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def useful_flops_per_token(target: Target, seq: int) -> tuple[float, str]:
    layer_ids = target_layer_ids(target.num_layers, context_layer_count(target.num_layers, None))
    run = target.layers[: max(layer_ids) + 1]
    params = sum(p.numel() for layer in run for p in layer.parameters())
    cfg = target.model.config
    kinds = la.layer_types(target.model)[: len(run)]
    full = sum(kind == "full_attention" for kind in kinds)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or target.hidden_size // heads
    attention = 2 * 2 * (seq / 2) * heads * head_dim * full
    flops = 2 * params + attention
    text = (
        f"{flops / 1e9:.2f} GFLOP/token: 2 x {params / 1e9:.3f} B params of layers "
        f"0..{len(run) - 1} + causal attention on {full} full-attention layers at S={seq}"
    )
    return flops, text


def _dynamo_counts() -> dict[str, int]:
    """Graphs dynamo compiled, frames it saw and graph breaks, so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "frames": counters["frames"]["total"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def _reset_compile(target: Target) -> None:
    uncompile_target_layers(target)
    torch._dynamo.reset()


class Bench:
    def __init__(self, out: Path, deadline: float, calls: int) -> None:
        self.out = out
        self.deadline = time.monotonic() + deadline
        self.calls = calls
        self.result: dict[str, Any] = {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "peak_flops": PEAK,
            "cases": {},
        }
        for name in ("transformers", "fla", "torchao", "triton"):
            try:
                module = __import__(name)
                self.result[name] = getattr(module, "__version__", "?")
            except ImportError:
                self.result[name] = None

    def case(
        self,
        name: str,
        target: Target,
        rows: int,
        seq: int,
        compiled: bool,
        flops: tuple[float, str],
        extra: dict[str, Any] | None = None,
        calls: int | None = None,
        needs_s: float = 30,
    ) -> dict[str, Any] | None:
        cases = self.result["cases"]
        if time.monotonic() > self.deadline - needs_s:
            cases[name] = {"error": "skipped: out of time (--deadline)"}
            log(f"{name}: skipped")
            self.save()
            return None
        log(f"{name} ...")
        try:
            graphs_before = _dynamo_counts()
            timed = time_target(target, rows, seq, calls or self.calls, compiled)
            if compiled:  # compile_s is the first call's excess over a timed one
                after = _dynamo_counts()
                timed |= {key: after[key] - graphs_before[key] for key in after}
            per_token, text = flops
            timed["mfu"] = round(per_token * rows * seq / (timed["ms_per_step"] / 1e3) / PEAK, 4)
            timed["flop_count"] = text
            timed["kernels"] = {"layer_paths": la.layer_paths(target), **(extra or {})}
            if compiled:
                timed["kernels"]["compiled_parts"] = la.compiled_parts(target.model)
            cases[name] = timed
            log(f"{name}: {json.dumps(timed)}")
        except Exception as exc:
            import traceback

            traceback.print_exc()
            cases[name] = {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
            log(f"{name}: failed: {exc}")
            _reset_compile(target)
        torch.cuda.empty_cache()
        self.save()
        return cases.get(name)

    def save(self) -> None:
        self.out.write_text(json.dumps(self.result, indent=2) + "\n")


def hybrid_cases(bench: Bench, parts: list[str], rows: int, seq: int) -> None:
    target = build_target("random:qwen3.5-27b", torch.device("cuda:0"))
    flops = useful_flops_per_token(target, seq)
    bench.result["hybrid_flops"] = flops[1]
    module = la._linear_attention_module(target.model)
    assert module is not None
    names = [name for name, _ in la.PARTS.values()]
    # As transformers chose them (build_target already put fla's conv1d in; undo that here).
    shipped = {n: getattr(getattr(module, n), "reference", getattr(module, n)) for n in names}

    def variant(reference: bool, fast_conv: bool) -> None:
        for name in names:
            setattr(module, name, shipped[name])
        if reference:
            la.use_reference_kernels(target.model)
        elif fast_conv:
            la.use_fast_conv1d(target.model)

    if "hybrid_eager" in parts:
        variant(reference=True, fast_conv=False)
        bench.case("hybrid_reference_eager", target, rows, seq, False, flops, calls=1, needs_s=120)
        variant(reference=False, fast_conv=False)
        bench.case("hybrid_fla_torch_conv_eager", target, rows, seq, False, flops, needs_s=90)
    variant(reference=False, fast_conv=True)
    if "hybrid_eager" in parts:
        bench.case("hybrid_fast_eager", target, rows, seq, False, flops, needs_s=60)
    if "hybrid_compiled" in parts:
        bench.case("hybrid_fast_compiled", target, rows, seq, True, flops, needs_s=100)
        _reset_compile(target)
    if "hybrid_fp8" in parts:
        converted = quantise_target_fp8(target)
        extra = {"target_dtype": "fp8", "fp8_linears": converted}
        bench.case("hybrid_fast_fp8_compiled", target, rows, seq, True, flops, extra, needs_s=60)
        _reset_compile(target)


def dense(bench: Bench, rows: int, seq: int) -> None:
    target = build_target("random:qwen3-8b", torch.device("cuda:0"))
    flops = useful_flops_per_token(target, seq)
    bench.case("qwen3-8b_bf16_compiled", target, rows, seq, True, flops, needs_s=40)
    _reset_compile(target)
    converted = quantise_target_fp8(target)
    extra = {"target_dtype": "fp8", "fp8_linears": converted}
    bench.case("qwen3-8b_fp8_eager", target, rows, seq, False, flops, extra, needs_s=20)
    bench.case("qwen3-8b_fp8_compiled", target, rows, seq, True, flops, extra, needs_s=60)
    _reset_compile(target)
    del target


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds for all cases")
    parser.add_argument("--calls", type=int, default=6, help="timed calls per case")
    parser.add_argument(
        "--parts", default="dense,hybrid_eager,hybrid_compiled,hybrid_fp8", help="which cases"
    )
    args = parser.parse_args()
    torch.cuda.set_device(0)
    bench = Bench(args.out, args.deadline, args.calls)
    parts = args.parts.split(",")
    steps: list[tuple[str, Callable[[], Any]]] = []
    if "dense" in parts:
        steps.append(("dense", lambda: dense(bench, 8, 2048)))
    if any(part.startswith("hybrid") for part in parts):
        steps.append(("hybrid", lambda: hybrid_cases(bench, parts, 4, 2048)))
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            import traceback

            traceback.print_exc()
            bench.result["cases"][f"{name}_setup"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
            bench.save()
        torch.cuda.empty_cache()
    cases = bench.result["cases"]
    print(f"{'case':34} {'Ktok/s':>8} {'ms':>8} {'GiB':>6} {'MFU':>6} {'compile_s':>9}")
    for name, case in cases.items():
        if "error" in case:
            print(f"{name:34} {case['error'][:80]}")
            continue
        print(
            f"{name:34} {case['ktok_s']:8.2f} {case['ms_per_step']:8.1f} {case['peak_gib']:6.1f} "
            f"{case['mfu']:6.3f} {case['compile_s'] if case['compile_s'] is not None else '-':>9}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
