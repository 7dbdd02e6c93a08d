"""Compile and warm up on the main thread before any worker thread starts: the target's
decoder layers (torch.compile), the drafter's pointwise work (drafter_compile.py) and its
flex attention, for the few batch shapes that, by dynamo's automatic-dynamic rules, leave a
graph for every shape of the epoch plan. A compile inside a worker thread holds the GIL for
seconds and once hung a launch; a compile that fails here falls back and says so instead of
ending the run (target layers to eager; the drafter's layers to eager; flex attention to
static shapes, then to SDPA)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dflash_train.model.attention_layout import (
    PAD_TO,
    _FlexState,
    _round_up,
    compile_static_shapes,
    compiles_flex,
    resolve_backend,
)
from dflash_train.model.compile_watch import set_hooks
from dflash_train.model.dflash_loss import ce_kernel_in_use
from dflash_train.model.drafter_compile import (
    compile_drafter,
    drafter_compile_wanted,
    drafter_compiled,
    uncompile_drafter,
)
from dflash_train.pipeline.target_workers import (
    compile_target_layers,
    target_compile_wanted,
    uncompile_target_layers,
    warm_up_target,
)

if TYPE_CHECKING:
    import torch

    from dflash_train.pipeline.drafter_step import DrafterStepper
    from dflash_train.targets.frozen_target import Target

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
    target_dtype: str = "bf16",
    compile_drafter: bool = True,
    distill: float = 0.0,
) -> dict[str, Any]:
    """What run_start reports: which implementation each hot part runs; per target layer
    type, which kernel each of its parts runs (linear_attention.layer_paths). Compiled parts
    say what is wanted; a compile that then fails says so in a warning event."""
    from dflash_train.targets.linear_attention import compiled_parts, layer_paths

    attention = resolve_backend(attention_backend, drafter_device)
    compiled = bool(targets) and target_compile_wanted(targets[0], compile_target)
    return {
        "attention": "flex" if attention == "flex" else "sdpa",
        "drafter_layers": (
            "compiled" if drafter_compile_wanted(drafter_device, compile_drafter) else "eager"
        ),
        "lm_head_loss": "fused_chunked_ce",
        "ce_kernel": ce_kernel_in_use(drafter_device, distill),
        "target_layers": "compiled" if compiled else "eager",
        "target_dtype": target_dtype,
        "target_layer_paths": layer_paths(targets[0]) if targets else None,
        # What the compiled graphs of each target layer type hold (None: eager).
        "target_layer_compile": compiled_parts(targets[0].model) if compiled else None,
    }


def drafter_shapes(
    lengths: Sequence[int],
    batches: Sequence[Sequence[int]],
    max_length: int,
    count: int = 2,
    pad_to: int = PAD_TO,
) -> list[tuple[int, int]]:
    """(rows, length) of the first distinct batch shapes in an epoch plan, at most `count`,
    the length (the longest sample, at most max_length) rounded up to `pad_to`."""
    shapes: dict[tuple[int, int], None] = {}  # ordered, and a fast membership test
    for batch in batches[: 4 * count]:
        if not batch:
            continue
        longest = min(max(int(lengths[i]) for i in batch), max_length)
        shapes.setdefault((len(batch), min(max_length, _round_up(longest, pad_to))))
        if len(shapes) >= count:
            break
    return list(shapes)


_SYMBOLIC = "symbolic"  # a graph dim dynamo left symbolic (it then takes any size >= 2)


def _covers(graph: tuple[Any, ...], key: tuple[int, ...]) -> bool:
    return all(g == v or (g == _SYMBOLIC and v >= 2) for g, v in zip(graph, key, strict=True))


def warm_up_shapes(
    lengths: Sequence[int],
    batches: Sequence[Sequence[int]],
    max_length: int,
    num_anchors: int,
    block_size: int,
    count: int = 4,
) -> list[tuple[int, int]]:
    """The (rows, length) batch shapes to run on the main thread, at most `count`, so that
    the compiled flex attention then has a graph for every batch shape of the plan.

    It follows dynamo's automatic dynamic shapes over the attention's sizes (rows, padded
    queries, padded keys): the first compile is static; a later one makes every size that
    differs from the first compile's symbolic, except a size of 1, which dynamo always
    specialises. So the picks are usually the plan's first shape, a shape that differs from
    it in every size that varies in the plan (one graph for all rows >= 2), and a one-row
    shape if the plan has one. Greedy: each pick is the shape whose graph covers most of
    the plan's shapes not yet covered (ties: plan order)."""

    def sizes(shape: tuple[int, int]) -> tuple[int, int, int]:
        rows, length = shape
        queries = _round_up(min(num_anchors, length) * block_size, PAD_TO)
        return rows, queries, _round_up(length, PAD_TO) + queries

    # Exact lengths: below num_anchors the query count follows the length, not its bucket.
    by_sizes: dict[tuple[int, int, int], tuple[int, int]] = {}  # the first shape of each
    for shape in drafter_shapes(lengths, batches, max_length, count=len(batches), pad_to=1):
        by_sizes.setdefault(sizes(shape), shape)
    keys = {shape: key for key, shape in by_sizes.items()}
    first: tuple[int, ...] | None = None  # the sizes dynamo recorded at the first compile
    dynamic = (False, False, False)  # which sizes it has seen change since
    picks: list[tuple[int, int]] = []
    left = list(keys)
    while left and len(picks) < count:
        best: tuple[int, tuple[Any, ...], tuple[bool, ...], tuple[int, int]] | None = None
        for shape in left[:32]:  # enough candidates; coverage is counted over all
            key = keys[shape]
            seen = first or key
            marks = tuple(d or v != f for d, v, f in zip(dynamic, key, seen, strict=True))
            graph = tuple(_SYMBOLIC if m and v >= 2 else v for m, v in zip(marks, key, strict=True))
            covered = sum(_covers(graph, keys[other]) for other in left)
            if best is None or covered > best[0]:
                best = (covered, graph, marks, shape)
        assert best is not None
        _, graph, dynamic, shape = best
        picks.append(shape)
        first = first or keys[shape]
        left = [other for other in left if not _covers(graph, keys[other])]
    return picks


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _compiled_mid_run(emit: Emit, part: str, what: str, shape: Sequence[int], spent: float) -> None:
    """A graph compiled after the warm-up, by the thread that met the shape: that thread,
    and with it the pool, waited meanwhile."""
    emit(
        "event", level="info", code="compiled",
        message=f"{what} compiled mid-run for a shape the warm-up did not cover, "
        f"{list(shape)}, in {spent:.1f} s",
        seconds=round(spent, 2), part=part, shape=list(shape),
    )  # fmt: skip


def _compiling_mid_run(emit: Emit, part: str, what: str, shape: tuple[int, ...]) -> None:
    """A compile after the warm-up as it begins: the target's holds its worker and the
    pool, the drafter's its step, until it ends (then `compiled` says how long)."""
    waits = "the pool" if part == "target_layers" else "the step"
    emit(
        "event", level="info", code="compiling",
        message=f"{what} compiling mid-run for a shape the warm-up did not cover, "
        f"{list(shape)}: {waits} waits until it ends",
        part=part, shape=list(shape),
    )  # fmt: skip


def _compile_failed(emit: Emit, exc: Exception, message: str) -> None:
    """A fallback said twice: on stderr with the whole exception, and as a warning event."""
    print(f"{message}: {exc!r}", file=sys.stderr)
    emit("event", level="warning", code="compile_failed", message=message)


def _try_warm_up(
    stepper: DrafterStepper, shapes: list[tuple[int, int]], dtype: Any
) -> float | Exception:
    """The warm-up's seconds, or the exception that ended it (its gradients dropped). Out of
    memory is raised: the real steps would not fit either, so say so now, as the run would."""
    import torch

    try:
        return stepper.warm_up(shapes, dtype)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        stepper.optimizer.zero_grad(set_to_none=True)
        return exc


def _warm_up_flex(
    stepper: DrafterStepper, shapes: list[tuple[int, int]], dtype: Any, emit: Emit
) -> tuple[float | None, list[tuple[int, int]]]:
    """(seconds, shapes warmed) of the flex warm-up with dynamic shapes; where inductor
    cannot compile those, with static ones (the first two shapes; later ones then compile
    on first use, as before); where that fails too, the drafter falls back to SDPA."""
    from dflash_train.model.drafter import _unwrap

    for static in (False, True):
        if static:
            compile_static_shapes()
            shapes = shapes[:2]
        outcome = _try_warm_up(stepper, shapes, dtype)
        if not isinstance(outcome, Exception):
            return outcome, shapes
        # e.g. no Triton config for this head size
        then = "using SDPA with a dense mask" if static else "compiling per shape"
        _compile_failed(
            emit, outcome, f"drafter flex attention failed to compile with "
            f"{'static' if static else 'dynamic'} shapes ({type(outcome).__name__}); {then}",
        )  # fmt: skip
    _unwrap(stepper.model).attention_backend = "sdpa"
    return None, []


def _warm_up_drafter(
    stepper: DrafterStepper, shapes: list[tuple[int, int]], dtype: Any, emit: Emit, flex: bool
) -> tuple[float | None, list[tuple[int, int]]]:
    """The drafter warm-up with its layers compiled; where that fails, with them eager (and
    flex's own fallbacks, `_warm_up_flex`). Without flex, SDPA needs no compile."""
    outcome = _try_warm_up(stepper, shapes, dtype)
    if not isinstance(outcome, Exception):
        return outcome, shapes  # the seconds it took
    # An op inductor cannot lower, say; or flex's dynamic graph (its fallbacks follow).
    uncompile_drafter(stepper.drafter)
    _compile_failed(
        emit, outcome, f"drafter warm-up failed with its layers compiled "
        f"({_first_line(outcome)}); running them eagerly",
    )  # fmt: skip
    if not flex:
        return None, []
    return _warm_up_flex(stepper, shapes, dtype, emit)


def _drafter_parts(layers: bool, attention: bool) -> str:
    """The drafter's compiled parts in words: "layers and attention", "layers", "" ..."""
    return " and ".join((["layers"] if layers else []) + (["attention"] if attention else []))


def _announce(emit: Emit, targets: int, drafter_layers: bool, flex: bool, shapes: int) -> None:
    """Say what is about to compile: minutes without a step (an fp8 Qwen3-8B target's layers
    took 108 s on the H200) read as a hang unless the operator sees why."""
    parts = (
        [f"the layers of {targets} target replica{'s' if targets != 1 else ''}"] if targets else []
    )
    drafter = _drafter_parts(drafter_layers, flex)
    if drafter:
        parts.append(f"the drafter's {drafter} for {shapes} batch shapes")
    if parts:
        emit(
            "event", level="info", code="compiling",
            message=f"compiling before the first step: {', '.join(parts)}",
            target_replicas=targets, drafter_layers=drafter_layers, drafter_attention=flex,
        )  # fmt: skip


def _progress(emit: Emit, target_s: float, drafter_layers: bool, flex: bool, shapes: int) -> None:
    """Say the target is done and what compiles now: on an H100 the drafter's layers went on
    compiling for minutes after the target's (bench/results/target_stage_h100_2026-12-05),
    and the stream should say which part a long warm-up is in."""
    drafter = _drafter_parts(drafter_layers, flex)
    emit(
        "event", level="info", code="compiling",
        message=f"target layers compiled in {target_s:.1f} s; now the drafter's {drafter} "
        f"for {shapes} batch shapes",
        part="drafter", target_s=target_s, drafter_layers=drafter_layers, drafter_attention=flex,
    )  # fmt: skip


def compile_before_workers(
    *,
    targets: Sequence[Target],
    layer_ids: Sequence[int],
    stepper: DrafterStepper,
    attention_backend: str,
    shapes: Sequence[tuple[int, int]],
    emit: Emit,
    compile_target: bool = True,
    compile_drafter_layers: bool = True,
) -> dict[str, Any]:
    """Compile and warm everything that compiles; emit one `compiled` event (and a warning
    per fallback). Later first-time shapes report their compile through `emit` too."""
    report: dict[str, Any] = {"target_s": None, "drafter_s": None, "shapes": list(shapes)}
    # The warm-up's compiles are announced as a whole, not one by one; and a hook left by an
    # earlier run in this process would write to its stream.
    set_hooks(None, None)
    device = stepper.device
    flex = compiles_flex(device) and resolve_backend(attention_backend, device) == "flex"
    drafter_layers = drafter_compile_wanted(device, compile_drafter_layers) and bool(shapes)
    wanted = [i for i, t in enumerate(targets) if target_compile_wanted(t, compile_target)]
    _announce(emit, len(wanted), drafter_layers, flex and bool(shapes), len(shapes))
    seconds = 0.0
    for index, target in enumerate(targets):
        if index not in wanted:
            continue
        layers = compile_target_layers(target, layer_ids)
        try:
            spent = warm_up_target(target, layer_ids)
        except Exception as exc:  # a kernel library that dynamo cannot trace, say
            uncompile_target_layers(target)
            _compile_failed(
                emit, exc, f"target {index}: torch.compile of its layers failed "
                f"({_first_line(exc)}); running them eagerly",
            )  # fmt: skip
            continue
        seconds += spent
        report["target_s"] = round(seconds, 2)
        # Each replica's own: whether later replicas (other GPUs) reuse the first's kernels.
        report.setdefault("target_s_each", []).append(round(spent, 2))
        report["target_layers_compiled"] = layers

    if drafter_layers:
        report["drafter_parts_compiled"] = compile_drafter(stepper.drafter)
    if report["target_s"] is not None and (flex or drafter_layers) and shapes:
        _progress(emit, report["target_s"], drafter_layers, flex, len(shapes))
    if (flex or drafter_layers) and shapes:
        import torch
        from torch._dynamo.utils import counters

        dtype = targets[0].embed_tokens.weight.dtype if targets else torch.bfloat16
        graphs = counters["stats"]["unique_graphs"]
        if drafter_layers:
            spent, shapes = _warm_up_drafter(stepper, list(shapes), dtype, emit, flex)
        else:
            spent, shapes = _warm_up_flex(stepper, list(shapes), dtype, emit)
        if spent is not None:
            report["drafter_s"] = round(spent, 2)
            report["drafter_graphs"] = counters["stats"]["unique_graphs"] - graphs
        report["shapes"] = list(shapes)
        report["drafter_layers_compiled"] = drafter_compiled(stepper.drafter)
    if report["target_s"] is not None or report["drafter_s"] is not None:
        # From now on a compile is said as it begins and when it has ended.
        set_hooks(
            functools.partial(_compiling_mid_run, emit), functools.partial(_compiled_mid_run, emit)
        )
        parts = []
        if report["target_s"] is not None:
            each = report["target_s_each"]
            per = f" ({', '.join(f'{t:.1f}' for t in each)} s a replica)" if len(each) > 1 else ""
            parts.append(f"target layers {report['target_s']:.1f} s{per}")
        if report["drafter_s"] is not None:
            what = _drafter_parts(bool(report["drafter_layers_compiled"]), flex)
            parts.append(
                f"drafter {what} {report['drafter_s']:.1f} s for shapes {list(shapes)} "
                f"({report.get('drafter_graphs', 0)} dynamo graphs, "
                f"{'dynamic' if _FlexState.dynamic is None else 'static'} shapes)"
            )
        emit(
            "event", level="info", code="compiled",
            message="compiled on the main thread before the workers: " + ", ".join(parts),
            seconds=round((report["target_s"] or 0) + (report["drafter_s"] or 0), 2),
            target_s=report["target_s"], target_s_each=report.get("target_s_each"),
            drafter_s=report["drafter_s"],
            drafter_shapes=[list(shape) for shape in shapes],
            drafter_graphs=report.get("drafter_graphs"),
            drafter_dynamic=_FlexState.dynamic is None if report["drafter_s"] is not None else None,
            drafter_layers_compiled=report.get("drafter_layers_compiled", False),
        )  # fmt: skip
    return report
