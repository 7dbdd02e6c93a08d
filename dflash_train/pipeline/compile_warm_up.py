"""Compile and warm up on the main thread before any worker thread starts: the target's
decoder layers (torch.compile) and the drafter's flex attention for the first batch shapes.
A compile inside a worker thread holds the GIL for seconds and once hung a launch; a
compile that fails here falls back to eager and says so instead of ending the run."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dflash_train.attention_layout import PAD_TO, _FlexState, resolve_backend
from dflash_train.pipeline.target_workers import (
    compile_target_layers,
    target_compile_wanted,
    uncompile_target_layers,
    warm_up_target,
)

if TYPE_CHECKING:
    import torch

    from dflash_train.pipeline.drafter_step import DrafterStepper
    from dflash_train.targets import Target

Emit = Callable[..., None]


def linear_attention_kernels(target: Target) -> dict[str, bool] | None:
    """For a hybrid target, whether transformers found the fast Gated-DeltaNet kernels
    (flash-linear-attention, causal-conv1d); None for a target without linear attention."""
    if "linear_attention" not in (getattr(target.model.config, "layer_types", None) or []):
        return None
    from transformers.utils import import_utils

    checks = {
        "fla": "is_flash_linear_attention_available",
        "causal_conv1d": "is_causal_conv1d_available",
    }
    return {name: bool(getattr(import_utils, fn, lambda: False)()) for name, fn in checks.items()}


def kernels_in_use(
    attention_backend: str,
    drafter_device: torch.device,
    targets: Sequence[Target],
    compile_target: bool = True,
) -> dict[str, Any]:
    """What run_start reports: which implementation each hot part runs."""
    attention = resolve_backend(attention_backend, drafter_device)
    compiled = bool(targets) and target_compile_wanted(targets[0], compile_target)
    return {
        "attention": "flex" if attention == "flex" else "sdpa",
        "lm_head_loss": "fused_chunked_ce",
        "target_layers": "compiled" if compiled else "eager",
        "linear_attention": linear_attention_kernels(targets[0]) if targets else None,
    }


def drafter_shapes(
    lengths: Sequence[int], batches: Sequence[Sequence[int]], max_length: int, count: int = 2
) -> list[tuple[int, int]]:
    """(rows, padded length) of the first distinct batch shapes in an epoch plan, at most
    `count` (each costs a compile of a few seconds on the main thread)."""
    shapes: list[tuple[int, int]] = []
    for batch in batches[: 4 * count]:
        if not batch:
            continue
        longest = min(max(int(lengths[i]) for i in batch), max_length)
        shape = (len(batch), min(max_length, -(-longest // PAD_TO) * PAD_TO))
        if shape not in shapes:
            shapes.append(shape)
        if len(shapes) >= count:
            break
    return shapes


def _fall_back_to_sdpa(stepper: DrafterStepper) -> None:
    from dflash_train.drafter import _unwrap

    _unwrap(stepper.model).attention_backend = "sdpa"
    stepper.optimizer.zero_grad(set_to_none=True)


def compile_before_workers(
    *,
    targets: Sequence[Target],
    layer_ids: Sequence[int],
    stepper: DrafterStepper,
    attention_backend: str,
    shapes: Sequence[tuple[int, int]],
    emit: Emit,
    compile_target: bool = True,
) -> dict[str, Any]:
    """Compile and warm everything that compiles; emit one `compiled` event (and a warning
    per fallback). Later first-time shapes report their compile through `emit` too."""
    report: dict[str, Any] = {"target_s": None, "drafter_s": None, "shapes": list(shapes)}
    seconds = 0.0
    for index, target in enumerate(targets):
        if not target_compile_wanted(target, compile_target):
            continue
        layers = compile_target_layers(target, layer_ids)
        try:
            spent = warm_up_target(target, layer_ids)
        except Exception as exc:  # a kernel library that dynamo cannot trace, say
            uncompile_target_layers(target)
            print(f"target compile failed, running eager: {exc!r}", file=sys.stderr)
            emit(
                "event", level="warning", code="compile_failed",
                message=f"target {index}: torch.compile of its layers failed ({type(exc).__name__}:"
                f" {str(exc).splitlines()[0] if str(exc) else ''}); running them eagerly",
            )  # fmt: skip
            continue
        seconds += spent
        report["target_s"] = round(seconds, 2)
        report["target_layers_compiled"] = layers
    device = stepper.device
    if device.type == "cuda" and resolve_backend(attention_backend, device) == "flex" and shapes:
        import torch

        dtype = targets[0].embed_tokens.weight.dtype if targets else torch.bfloat16
        try:
            report["drafter_s"] = round(stepper.warm_up(list(shapes), dtype), 2)
        except torch.cuda.OutOfMemoryError:
            raise  # the real steps would not fit either: say so now, as the run would
        except Exception as exc:  # e.g. no Triton config for this head size
            _fall_back_to_sdpa(stepper)
            print(f"flex attention compile failed, using SDPA: {exc!r}", file=sys.stderr)
            emit(
                "event", level="warning", code="compile_failed",
                message=f"drafter flex attention failed to compile ({type(exc).__name__}); "
                "using SDPA with a dense mask",
            )  # fmt: skip
            shapes = []

        def on_new_shape(spent: float, key: tuple[Any, ...]) -> None:
            if spent >= 0.5:  # a cache hit is no compile
                emit(
                    "event", level="info", code="compiled",
                    message=f"drafter attention compiled for a new shape {list(key[0])} in "
                    f"{spent:.1f} s",
                    seconds=round(spent, 2), part="drafter_attention", shape=list(key[0]),
                )  # fmt: skip

        if shapes:
            _FlexState.on_compile = on_new_shape
    if report["target_s"] is not None or report["drafter_s"] is not None:
        parts = []
        if report["target_s"] is not None:
            parts.append(f"target layers {report['target_s']:.1f} s")
        if report["drafter_s"] is not None:
            parts.append(f"drafter attention {report['drafter_s']:.1f} s for shapes {list(shapes)}")
        emit(
            "event", level="info", code="compiled",
            message="compiled on the main thread before the workers: " + ", ".join(parts),
            seconds=round((report["target_s"] or 0) + (report["drafter_s"] or 0), 2),
            target_s=report["target_s"], drafter_s=report["drafter_s"],
        )  # fmt: skip
    return report
