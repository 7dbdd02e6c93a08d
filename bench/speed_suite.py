"""The one-GPU speed suite (`bench/pipeline.py --suite speed`): drafter step at Qwen3-8B and
Qwen3.6-27B dims, flex vs dense exactness in bf16, target stage eager vs compiled (dense and
hybrid), monitor overhead in a target-bound and a drafter-bound recipe, checkpoint stall.
Target and drafter share the one GPU. Every case records ktok_s (sequence tokens per
second), ms_per_step, peak_gib, mfu and compile_s where they apply.

MFU counts useful FLOPs only, against the dense bf16 datasheet peak (989 TFLOP/s for
H100/H200): drafter = its matmuls on the block queries (2·params per row, forward; x3 with
backward) + K/V projections of the context + fc, attention on the allowed query-key pairs
only (4·D·heads per pair forward, x3 with backward), and the lm_head on the rows that carry
loss (forward + input gradient: x2, the lm_head is frozen). Target = 2·params per token of
the layers it runs + causal attention."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from speed_drafter import (
    PEAK,
    DrafterRig,
    _peak_gib,
    _reset_peak,
    _sync,
    drafter_config,
    exactness,
    fused_ce_check,
    log,
    time_drafter,
)
from speed_monitor import monitor_overhead


def time_target(target: Any, rows: int, seq: int, calls: int, compile_: bool) -> dict[str, Any]:
    from dflash_train.pipeline.target_workers import compile_target_layers
    from dflash_train.targets.frozen_target import (
        context_layer_count,
        extract_context,
        target_layer_ids,
    )

    layer_ids = target_layer_ids(target.num_layers, context_layer_count(target.num_layers, None))
    gen = torch.Generator(device=target.device).manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (rows, seq), device=target.device, generator=gen)
    mask = torch.ones_like(ids)
    device = target.device
    if compile_:
        compile_target_layers(target, layer_ids)
    _reset_peak(device)
    start = time.perf_counter()
    extract_context(target, ids, mask, layer_ids)
    _sync(device)
    first = time.perf_counter() - start
    extract_context(target, ids, mask, layer_ids)
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        extract_context(target, ids, mask, layer_ids)
    _sync(device)
    seconds = (time.perf_counter() - start) / calls
    from pipeline import target_flops_per_token

    flops = target_flops_per_token(target, max(layer_ids), seq) * rows * seq
    return {
        "compiled": compile_,
        "ktok_s": round(rows * seq / seconds / 1e3, 3),
        "ms_per_step": round(seconds * 1e3, 1),
        "calls": calls,
        "peak_gib": _peak_gib(device),
        "mfu": round(flops / seconds / PEAK, 4),
        "first_call_s": round(first, 2),
        "compile_s": round(first - seconds, 2) if compile_ else None,
    }


def run_suite(args: Any) -> int:
    smoke = args.device == "cpu"
    device = torch.device("cpu") if smoke else torch.device("cuda:0")
    if not smoke:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    dense, big, seq = ("tiny", "tiny", 128) if smoke else ("qwen3-8b", "qwen3.6-27b", 2048)
    rows, anchors, flex = (2, 16, "sdpa") if smoke else (8, 512, "flex")
    deadline = time.monotonic() + args.deadline
    out: dict[str, Any] = {
        "device": "cpu" if smoke else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "peak_flops": PEAK,
        "cases": {},
        "flop_count": "useful only (speed_suite.py docstring)",
    }
    cases = out["cases"]
    steps = args.steps

    wanted = [c for c in (args.cases or "").split(",") if c]

    def guarded(name: str, fn: Callable[[], Any]) -> None:
        if wanted and not any(name.startswith(w) for w in wanted):
            return
        if time.monotonic() > deadline:
            cases[name] = {"error": "skipped: out of time (--deadline)"}
            log(f"{name}: skipped")
            return
        log(f"{name} ...")
        try:
            cases[name] = fn()
            log(f"{name}: {json.dumps(cases[name])}")
        except torch.cuda.OutOfMemoryError as exc:
            cases[name] = {"error": f"OOM: {str(exc).splitlines()[0]}"}
            log(f"{name}: OOM")
        except Exception as exc:
            import traceback

            traceback.print_exc()
            cases[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            log(f"{name}: failed: {exc}")
        if not smoke:
            torch.cuda.empty_cache()
        args.out.write_text(json.dumps(out, indent=2) + "\n")  # partial results survive

    if (
        not smoke
    ):  # flex has no CPU backward: the CPU twin is tests/trainer/test_attention_layout.py
        guarded("exactness_bf16", lambda: exactness(device))

    def drafter_case(dims: str, n_rows: int, backends: tuple[str, ...]) -> dict[str, Any]:
        rig = DrafterRig(
            drafter_config(dims, 1 if smoke else 5, 16 if not smoke else 4),
            n_rows, seq, anchors, device,
        )  # fmt: skip
        result: dict[str, Any] = {
            b: time_drafter(rig, b, steps if b == flex else 2) for b in backends
        }
        result["fused_ce_vs_reference"] = fused_ce_check(rig)
        del rig
        return result

    both = (flex,) if smoke else (flex, "sdpa")
    guarded(f"drafter_{dense}_{rows}x{seq}", lambda: drafter_case(dense, rows, both))

    from pipeline import build_target

    holder: dict[str, Any] = {}

    def target_dense() -> dict[str, Any]:
        holder["t"] = build_target("random:tiny" if smoke else "random:qwen3-8b", device)
        eager = time_target(holder["t"], rows, seq, args.target_calls, False)
        if smoke:  # inductor's CPU codegen is minutes on 2 cores; tests cover the compile path
            return {"eager": eager}
        compiled = time_target(holder["t"], rows, seq, args.target_calls, True)
        return {"eager": eager, "compiled": compiled}

    guarded(f"target_{dense}_{rows}x{seq}", target_dense)
    if "t" not in holder and (not wanted or any(w.startswith("monitor") for w in wanted)):
        holder["t"] = build_target("random:tiny" if smoke else "random:qwen3-8b", device)
    if "t" in holder:
        for name, layers, n_anchors in (("target_bound", 1, 64), ("drafter_bound", 5, 512)):
            recipe = {
                "draft_layers": 1 if smoke else layers,
                "rows": rows,
                "anchors": min(n_anchors, anchors),
            }
            guarded(
                f"monitor_{name}",
                lambda r=recipe: monitor_overhead(
                    holder["t"], r, args.seconds, args.rounds, device, dense, seq
                ),
            )
    holder.clear()
    from checkpoint_stall import checkpoint_stall

    guarded("checkpoint_stall", lambda: checkpoint_stall(device, dense, 1 if smoke else 2))
    guarded(f"drafter_{big}_{rows // 2}x{seq}", lambda: drafter_case(big, rows // 2, (flex,)))
    guarded(f"drafter_{big}_{rows}x{seq}", lambda: drafter_case(big, rows, (flex,)))

    def hybrid() -> dict[str, Any]:
        from dflash_train.pipeline.compile_warm_up import linear_attention_kernels

        target = build_target("random:tiny-hybrid" if smoke else "random:qwen3.5-27b", device)
        kernels = linear_attention_kernels(target)
        calls = max(2, args.target_calls // 2)
        eager = time_target(target, max(1, rows // 2), seq, calls, False)
        result: dict[str, Any] = {"linear_attention_kernels": kernels, "eager": eager}
        if not smoke and time.monotonic() < deadline - 60:
            result["compiled"] = time_target(target, rows // 2, seq, calls, True)
        return result

    guarded(f"target_{'tiny-hybrid' if smoke else 'qwen3.5-27b'}_{max(1, rows // 2)}x{seq}", hybrid)
    out["summary"] = summarise(cases)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    log(f"wrote {args.out}")
    print(json.dumps(out["summary"], indent=2))
    return 0


def _get(cases: dict[str, Any], *path: str) -> Any:
    node: Any = cases
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


# (figure, path into the cases, goal, "min" = at least / "max" = below / "true")
GOALS = (
    ("drafter_8b_ktok_s", ("drafter_qwen3-8b_8x2048", "flex", "ktok_s"), 14.0, "min"),
    ("drafter_27b_4x2048_ktok_s", ("drafter_qwen3.6-27b_4x2048", "flex", "ktok_s"), 8.4, "min"),
    ("drafter_27b_8x2048_ktok_s", ("drafter_qwen3.6-27b_8x2048", "flex", "ktok_s"), 0.0, "min"),
    ("target_8b_compiled_ktok_s", ("target_qwen3-8b_8x2048", "compiled", "ktok_s"), 43.0, "min"),
    ("target_hybrid_eager_ktok_s", ("target_qwen3.5-27b_4x2048", "eager", "ktok_s"), 11.5, "min"),
    (
        "target_hybrid_compiled_ktok_s",
        ("target_qwen3.5-27b_4x2048", "compiled", "ktok_s"),
        11.5,
        "min",
    ),
    ("monitor_overhead_target_bound", ("monitor_target_bound", "monitor_overhead"), 0.01, "max"),
    ("monitor_overhead_drafter_bound", ("monitor_drafter_bound", "monitor_overhead"), 0.01, "max"),
    ("checkpoint_stall_s", ("checkpoint_stall", "stall_s"), 1.0, "max"),
    ("exactness_passed", ("exactness_bf16", "passed"), True, "true"),
)


def summarise(cases: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, path, goal, kind in GOALS:
        value = _get(cases, *path)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            met = None
        elif kind == "true":
            met = value is True
        elif kind == "max":
            met = value < goal
        else:
            met = value >= goal
        summary[name] = {"value": value, "goal": goal, "met": met}
    return summary
