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
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from dflash_train.dflash_loss import sample_anchors
from dflash_train.drafter import DFlashConfig, DFlashDrafter
from dflash_train.pipeline.drafter_step import DrafterStepper, StepConfig
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.pipeline.target_workers import HiddenBatch

PEAK = 989e12
DIMS: dict[str, dict[str, Any]] = {
    "qwen3-8b": {
        "hidden": 4096,
        "heads": 32,
        "kv": 8,
        "head_dim": 128,
        "inter": 12288,
        "vocab": 151936,
        "target_layers": 36,
        "theta": 1e6,
    },
    "qwen3.6-27b": {
        "hidden": 5120,
        "heads": 24,
        "kv": 4,
        "head_dim": 256,
        "inter": 17408,
        "vocab": 248320,
        "target_layers": 64,
        "theta": 1e7,
    },
    # --device cpu --smoke: the same code at toy size (SmolLM2's vocab, random:tiny's depth)
    "tiny": {
        "hidden": 64,
        "heads": 4,
        "kv": 2,
        "head_dim": 16,
        "inter": 128,
        "vocab": 49152,
        "target_layers": 6,
        "theta": 1e6,
    },
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def drafter_config(dims: str, layers: int, block: int, context_layers: int = 5) -> DFlashConfig:
    d = DIMS[dims]
    from dflash_train.targets import context_layer_count, target_layer_ids

    return DFlashConfig(
        hidden_size=d["hidden"],
        num_layers=layers,
        num_heads=d["heads"],
        num_kv_heads=d["kv"],
        head_dim=d["head_dim"],
        intermediate_size=d["inter"],
        rms_norm_eps=1e-6,
        rope_theta=d["theta"],
        block_size=block,
        target_layer_ids=tuple(
            target_layer_ids(
                d["target_layers"],
                min(context_layers, context_layer_count(d["target_layers"], None)),
            )
        ),
        num_target_layers=d["target_layers"],
        mask_token_id=d["vocab"] - 1,
        mask_mode="token",
        max_position=40960,
        vocab_size=d["vocab"],
    )


class DrafterRig:
    """A drafter + stepper with random frozen embedding/lm_head and in-memory batches."""

    def __init__(
        self,
        config: DFlashConfig,
        rows: int,
        seq: int,
        anchors: int,
        device: torch.device,
        embed: Any = None,
        head: Any = None,
    ) -> None:
        torch.manual_seed(0)
        self.config, self.rows, self.seq, self.anchors, self.device = (
            config,
            rows,
            seq,
            anchors,
            device,
        )
        vocab, hidden = config.vocab_size, config.hidden_size
        if embed is None:
            embed = torch.nn.Embedding(vocab, hidden, device=device, dtype=_dtype(device))
            head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=_dtype(device))
            embed.requires_grad_(False)
            head.requires_grad_(False)
        self.embed, self.head = embed, head
        self.drafter = DFlashDrafter(config).to(device)
        self.stepper = DrafterStepper(
            self.drafter,
            self.drafter,
            embed_tokens=embed,
            lm_head=head,
            device=device,
            timers=StageTimers(),
            config=StepConfig(
                lr=1e-4,
                weight_decay=0.01,
                warmup_steps=10,
                total_steps=10**6,
                grad_clip=1.0,
                block_size=config.block_size,
                num_anchors=anchors,
                seed=0,
            ),
        )
        gen = torch.Generator(device=device).manual_seed(1)
        ids = torch.randint(0, vocab, (rows, seq), device=device, generator=gen)
        mask = torch.zeros_like(ids)
        mask[:, seq // 4 :] = 1
        width = len(config.target_layer_ids) * hidden
        ctx = torch.randn(rows, seq, width, device=device, dtype=_dtype(device), generator=gen)
        self.batch = HiddenBatch(0, 0, ids, torch.ones_like(ids), mask, ctx, rows * seq)

    def useful_flops(self) -> float:
        c, b = self.config, self.batch
        gen = torch.Generator(device=self.device).manual_seed(0)
        anchors, valid = sample_anchors(b.loss_mask, self.anchors, c.block_size, gen)
        queries = int(valid.sum()) * c.block_size
        pairs = float((anchors * valid).sum()) * c.block_size + queries * c.block_size
        h, q_dim, kv_dim = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        per_query = 2 * (2 * h * q_dim + 2 * h * kv_dim + 3 * h * c.intermediate_size)
        ctx_rows = self.rows * self.seq
        layers = c.num_layers * (
            3 * queries * per_query
            + 3 * ctx_rows * 2 * 2 * h * kv_dim
            + 3 * 4 * pairs * c.head_dim * c.num_heads
        )
        fc = 2 * ctx_rows * len(c.target_layer_ids) * h * h * 2  # fwd + weight grad
        loss_rows = int(valid.sum()) * (c.block_size - 1)  # slot 0 carries no loss
        lm_head = 2 * 2 * loss_rows * h * c.vocab_size
        return float(layers + fc + lm_head)

    def step(self) -> None:
        self.stepper.step(self.batch, 0)


def time_drafter(rig: DrafterRig, backend: str, steps: int) -> dict[str, Any]:
    rig.drafter.attention_backend = backend
    device = rig.device
    _reset_peak(device)
    compile_s = rig.stepper.warm_up([(rig.rows, rig.seq)], _dtype(device))
    rig.step()  # the optimizer's first step allocates its moments
    _sync(device)
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    for _ in range(steps):
        rig.step()
    _sync(device)
    recompiled = counters["stats"]["unique_graphs"] - graphs
    seconds = (time.perf_counter() - start) / steps
    flops = rig.useful_flops()
    return {
        "backend": backend,
        "ktok_s": round(rig.rows * rig.seq / seconds / 1e3, 3),
        "ms_per_step": round(seconds * 1e3, 1),
        "steps": steps,
        "peak_gib": _peak_gib(device),
        "mfu": round(flops / seconds / PEAK, 4),
        "useful_tflop_per_step": round(flops / 1e12, 2),
        "compile_s": round(compile_s, 2),
        "graphs_compiled_while_timed": recompiled,
        "params_m": round(sum(p.numel() for p in rig.drafter.parameters()) / 1e6, 1),
    }


def exactness(device: torch.device, dims: str = "qwen3-8b") -> dict[str, Any]:
    """flex vs dense SDPA on the same weights and batch, bf16 autocast, Qwen3-8B dims."""
    rig = DrafterRig(drafter_config(dims, 1, 16), 2, 1024, 128, device)
    from dflash_train.dflash_loss import dflash_forward_loss

    results = {}
    gen = torch.Generator(device=device).manual_seed(0)
    anchors, valid = sample_anchors(rig.batch.loss_mask, 128, 16, gen)
    for backend in ("sdpa", "flex"):
        rig.drafter.attention_backend = backend
        rig.drafter.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = dflash_forward_loss(
                rig.drafter,
                rig.embed,
                rig.head,
                rig.batch.context,
                rig.batch.input_ids,
                rig.batch.loss_mask,
                anchors,
                valid,
            )
        out.loss.backward()
        grads = {n: p.grad.float().clone() for n, p in rig.drafter.named_parameters()}
        results[backend] = (float(out.loss), grads, out.slot_correct.sum().item())
    (loss_d, g_d, c_d), (loss_f, g_f, c_f) = results["sdpa"], results["flex"]
    rel = {n: float((g_f[n] - g_d[n]).norm() / g_d[n].norm().clamp_min(1e-30)) for n in g_d}
    worst = max(rel, key=rel.get)
    out = {
        "loss_sdpa": loss_d,
        "loss_flex": loss_f,
        "loss_rel_diff": abs(loss_f - loss_d) / loss_d,
        "grad_rel_err_max": rel[worst],
        "grad_rel_err_worst_param": worst,
        "grad_rel_err_median": sorted(rel.values())[len(rel) // 2],
        "correct_sdpa": c_d,
        "correct_flex": c_f,
    }
    out["passed"] = out["loss_rel_diff"] < 5e-3 and out["grad_rel_err_max"] < 5e-2
    return out


def fused_ce_check(rig: DrafterRig, rows: int = 4096) -> dict[str, float]:
    """The fused lm_head CE (the kernel the step ran) against F.cross_entropy on the same
    bf16 logits: loss and the hidden-state gradient, relative error."""
    import torch.nn.functional as F

    from dflash_train.dflash_loss import linear_cross_entropy

    gen = torch.Generator(device=rig.device).manual_seed(7)
    hidden = torch.randn(rows, rig.config.hidden_size, device=rig.device, generator=gen)
    hidden = hidden.to(rig.head.weight.dtype).requires_grad_(True)
    labels = torch.randint(0, rig.config.vocab_size, (rows,), device=rig.device, generator=gen)
    weights = torch.rand(rows, device=rig.device, generator=gen)
    total, _, _ = linear_cross_entropy(hidden, rig.head, labels, weights)
    total.backward()
    fused = hidden.grad.float().clone()
    hidden.grad = None
    ref = (F.cross_entropy(rig.head(hidden).float(), labels, reduction="none") * weights).sum()
    ref.backward()
    grad_err = (fused - hidden.grad.float()).norm() / hidden.grad.float().norm()
    return {
        "loss_rel_err": round(abs(float(total) - float(ref)) / abs(float(ref)), 8),
        "grad_rel_err": round(float(grad_err), 6),
    }


def time_target(target: Any, rows: int, seq: int, calls: int, compile_: bool) -> dict[str, Any]:
    from dflash_train.pipeline.target_workers import compile_target_layers
    from dflash_train.targets import context_layer_count, extract_context, target_layer_ids

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


def monitor_overhead(
    target: Any,
    recipe: dict[str, int],
    seconds: float,
    rounds: int,
    device: torch.device,
    dims: str = "qwen3-8b",
    seq: int = 2048,
) -> dict[str, Any]:
    """Async pipeline (target worker thread -> pool -> drafter) with the monitor off and on,
    alternating, on one GPU: the rate lost with the monitor on."""
    from pipeline import MemoryLoader

    from dflash_train.pipeline.monitor import MonitorIntervals, MonitorThread, StepRecord
    from dflash_train.pipeline.pool import HiddenStatePool
    from dflash_train.pipeline.sources import AsyncSource, EpochPlan
    from dflash_train.status_writer import StatusWriter
    from dflash_train.targets import Target

    config = drafter_config(dims, recipe["draft_layers"], 16)
    rig = DrafterRig(
        config, recipe["rows"], seq, recipe["anchors"], device, target.embed_tokens, target.lm_head
    )
    rig.stepper.warm_up([(rig.rows, rig.seq)], _dtype(device))
    loader = MemoryLoader(rig.rows, seq, target.vocab_size, pin=device.type == "cuda")
    plan = EpochPlan(0, [[0]] * 10**6, list(range(10**6)))
    layer_ids = list(config.target_layer_ids)
    assert isinstance(target, Target)

    def section(with_monitor: bool) -> float:
        pool: HiddenStatePool[HiddenBatch] = HiddenStatePool(4, 2)
        timers = StageTimers()
        source = AsyncSource(
            loader,
            [target],
            layer_ids=layer_ids,
            drafter_device=device,  # type: ignore[arg-type]
            timers=timers,
            pool=pool,
        )
        monitor = None
        if with_monitor:
            status = os.path.join(tempfile.mkdtemp(), "status.jsonl")
            from pathlib import Path

            monitor = MonitorThread(
                StatusWriter(Path(status), "bench"),
                block_size=16,
                max_bad_steps=10**9,
                on_fatal=lambda _m: None,
                timers=timers,
                pool=pool,
                producers=1,
                gpu_roles={device.index or 0: "target+drafter"},
                allocator_devices=(device,) if device.type == "cuda" else (),
                intervals=MonitorIntervals(profile=5.0),
            )
            monitor.start()
        batches = source.batches(plan, lambda: False)
        try:
            for _ in range(2):  # fill the pool, settle
                hb = next(batches)
                hb.wait_ready(device)
                rig.stepper.step(hb, 0)
            _sync(device)
            tokens, n, start = 0, 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                hb = next(batches)
                hb.wait_ready(device)
                rig.stepper.step(hb, 0)
                n += 1
                tokens += hb.tokens
                if monitor is not None:
                    monitor.submit_step(
                        StepRecord(
                            n,
                            0,
                            0.0,
                            rig.stepper.lr,
                            tokens,
                            hb.tokens,
                            time.monotonic(),
                            rig.stepper.snapshot(),
                        )
                    )
            _sync(device)
            return tokens / (time.perf_counter() - start) / 1e3
        finally:
            batches.close()
            source.close()
            if monitor is not None:
                monitor.stop()

    off, on = [], []
    for _ in range(rounds):
        off.append(round(section(False), 3))
        on.append(round(section(True), 3))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "recipe": recipe,
        "ktok_s_off": off,
        "ktok_s_on": on,
        "monitor_overhead": round(1 - sum(on) / sum(off), 4),
        "per_round": [round(1 - b / a, 4) for a, b in zip(off, on, strict=True)],
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
