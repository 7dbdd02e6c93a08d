"""The drafter side of the speed suite (bench/speed_suite.py): a drafter with random frozen
embedding / lm_head fed from memory, its timing, the useful-FLOP count, and the bf16
exactness checks (flex vs dense attention, fused vs plain cross-entropy)."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from dflash_train.model.dflash_loss import sample_anchors
from dflash_train.model.drafter import DFlashConfig, DFlashDrafter
from dflash_train.model.drafter_compile import (
    compile_drafter,
    drafter_compile_wanted,
    drafter_compiled,
)
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
    from dflash_train.targets.frozen_target import context_layer_count, target_layer_ids

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
    """A drafter + stepper with random frozen embedding/lm_head and in-memory batches. The
    drafter's layers compile as the trainer's do (drafter_compile.py: on CUDA, unless
    `compile_layers` is False); time_drafter's warm-up compiles their graphs."""

    def __init__(
        self,
        config: DFlashConfig,
        rows: int,
        seq: int,
        anchors: int,
        device: torch.device,
        embed: Any = None,
        head: Any = None,
        compile_layers: bool = True,
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
        if drafter_compile_wanted(device, compile_layers):
            compile_drafter(self.drafter)
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
        "drafter_layers": "compiled" if drafter_compiled(rig.drafter) else "eager",
        "params_m": round(sum(p.numel() for p in rig.drafter.parameters()) / 1e6, 1),
    }


def exactness(device: torch.device, dims: str = "qwen3-8b") -> dict[str, Any]:
    """flex vs dense SDPA on the same weights and batch, bf16 autocast, Qwen3-8B dims."""
    rig = DrafterRig(drafter_config(dims, 1, 16), 2, 1024, 128, device)
    from dflash_train.model.dflash_loss import dflash_forward_loss

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

    from dflash_train.model.dflash_loss import linear_cross_entropy

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
