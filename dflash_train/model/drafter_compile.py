"""torch.compile of the drafter's pointwise work, so inductor fuses it into a few kernels.

Eager, a drafter step spends ~20 % of an H200's time on it (issue 28's profile at Qwen3-8B
dims: 154 ms elementwise + 59 ms norm of 1108): each RMSNorm copies its input to float32
and back, rotary is a neg, a cat, two muls and an add, SwiGLU and the residuals are a
kernel apiece, forward and backward. Compiled here, per decoder layer: the stretch before
attention (input norm, q/k/v projections, q/k norms, rotary) and the one after it (output
projection, residual, post-attention norm, SwiGLU MLP, residual); and the context and final
norms. Attention stays outside them, with its own graphs: flex's BlockMask carries Python
ints that need automatic dynamic shapes (a static first graph, attention_layout.py), while
these stretches take only tensors, so `dynamic=True` gives one graph for every batch of
two rows or more from the first compile (dynamo specialises a size of 1: one-row batches
get one more). The five layers share their graphs (one code object, parameters as inputs).

On by default for CUDA drafters (`compile_drafter`, DFLASH_COMPILE_DRAFTER=0 turns it off),
off on the CPU; compile_warm_up.py compiles the graphs on the main thread before any worker
starts. The eager path is exactly the uncompiled forward: `uncompile_drafter` restores it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dflash_train.model.compile_watch import watching
from dflash_train.model.drafter import DFlashDrafter, _unwrap

# The per-instance methods compiled; the drafter's own norms compile their `forward`.
LAYER_PARTS = ("attention_inputs", "attention_output_and_mlp")
# Profiler range around each compiled call: bench/profile_drafter.py tells these fused
# kernels from flex's compiled graph by it (no "attention" in it: that word means flex's).
PROFILER_RANGE = "drafter_pointwise"
_LABELS = {"attention_inputs": "qkv", "attention_output_and_mlp": "o_mlp", "forward": "norm"}
Backend = str | Callable[..., Any]  # torch.compile's: a name, or a compiler function (tests)


def _compile_options(backend: Backend) -> dict[str, Any] | None:
    """Inductor's options for these graphs: its coalescing analysis off. That analysis
    (choosing tilings for kernels that mix pointwise and reduction work) asserts on the
    drafter's stretches in torch 2.11 (`tiling_utils.get_pw_red_splits`), so on the H200
    every drafter layer fell back to eager; with it off they compile, and the step at
    Qwen3-8B dims is 982 ms against 1109 eager (bench/results/target_stage_h200_2026-12-05).
    Other backends take no options; a torch without the setting gets none."""
    if backend != "inductor":
        return None
    from torch._inductor import config

    if not hasattr(config.triton, "coalesce_tiling_analysis"):
        return None
    return {"triton.coalesce_tiling_analysis": False}


class _Compiled:
    """A compiled method that tells the hook when one of its calls compiled a graph."""

    def __init__(self, method: Callable[..., Any], part: str, backend: Backend) -> None:
        self.part = part
        self.label = f"{PROFILER_RANGE}:{_LABELS[part]}"
        # fullgraph: a graph break would split the fusion silently; failing here, in the
        # warm-up, falls back to eager and says so.
        self.compiled = torch.compile(
            method, dynamic=True, fullgraph=True, backend=backend, options=_compile_options(backend)
        )

    def __call__(self, first: torch.Tensor, *rest: Any) -> Any:
        shape = tuple(first.shape)
        with (
            torch.profiler.record_function(self.label),
            watching("drafter_layers", f"drafter layers' {self.part}", shape),
        ):
            return self.compiled(first, *rest)


def drafter_compile_wanted(device: torch.device, wanted: bool = True) -> bool:
    """Compile the drafter's pointwise work: on CUDA, unless the run's config says not to
    (`compile_drafter`, or DFLASH_COMPILE_DRAFTER=0 through the config loader). The CPU
    stays eager: its runs are tests and small recipes, and inductor's C++ codegen costs
    ~35 s up front there (2 cores, cold cache)."""
    return wanted and device.type == "cuda"


def _compiled_modules(drafter: DFlashDrafter) -> list[tuple[nn.Module, str]]:
    parts: list[tuple[nn.Module, str]] = [
        (layer, part) for layer in drafter.layers for part in LAYER_PARTS
    ]
    return [*parts, (drafter.hidden_norm, "forward"), (drafter.norm, "forward")]


def compile_drafter(drafter: nn.Module, backend: Backend = "inductor") -> int:
    """Compile every part named above (idempotent); returns the parts now compiled. Only
    instance attributes change: weights, state_dict names and export are untouched."""
    core = _unwrap(drafter)
    count = 0
    for module, name in _compiled_modules(core):
        if name not in vars(module):
            setattr(module, name, _Compiled(getattr(module, name), name, backend))
        count += 1
    return count


def uncompile_drafter(drafter: nn.Module) -> None:
    for module, name in _compiled_modules(_unwrap(drafter)):
        vars(module).pop(name, None)


def drafter_compiled(drafter: nn.Module) -> bool:
    core = _unwrap(drafter)
    return any(name in vars(module) for module, name in _compiled_modules(core))
