"""Compiling the target's layers keeps extract_context's values, and the main-thread
warm-up leaves nothing to compile for later batch shapes (so no worker thread compiles).
Dynamo's graph capture is real; the 'eager' backend skips only the C++/Triton codegen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from drafter_fixtures import open_cpu_flex_backward, tiny_drafter, tiny_stepper
from torch._dynamo.utils import counters

from dflash_train.model.attention_layout import _FlexState
from dflash_train.model.compile_watch import _compile_started, _Hooks, set_hooks
from dflash_train.pipeline.compile_warm_up import (
    compile_before_workers,
    drafter_shapes,
    kernels_in_use,
    warm_up_shapes,
)
from dflash_train.pipeline.target_workers import (
    compile_target_layers,
    target_compile_wanted,
    uncompile_target_layers,
    warm_up_target,
)
from dflash_train.targets.frozen_target import Target, extract_context
from dflash_train.targets.presets import RANDOM_PRESETS, build_random_model


@pytest.fixture(autouse=True)
def _no_compile_hooks() -> Iterator[None]:
    """compile_before_workers leaves its hooks for the run's threads: a test's go with it."""
    yield
    set_hooks()


def _fresh_tiny_target() -> Target:
    torch.manual_seed(0)
    model = build_random_model(RANDOM_PRESETS["tiny"], torch.device("cpu"), torch.float32)
    model.eval().requires_grad_(False)
    embed = model.get_input_embeddings()
    return Target(
        "random:tiny", model, None, 6, 64, int(embed.weight.shape[0]), embed,
        model.get_output_embeddings(),
    )  # fmt: skip


def _batch(rows: int, length: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 1000 + length)
    ids = torch.randint(0, 1000, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[-1, length - 7 :] = 0
    return ids, mask


def test_compiled_layers_give_the_eager_context_and_warm_up_covers_later_shapes() -> None:
    target = _fresh_tiny_target()
    layer_ids = [1, 3]
    # A one-row batch too: dynamo specialises a size of 1 (WARM_UP_SHAPES says why).
    later = [(4, 97, True), (5, 131, False), (2, 40, True), (1, 75, False)]
    eager = [extract_context(target, *_batch(*shape), layer_ids) for shape in later]
    assert compile_target_layers(target, layer_ids, backend="eager") == 4  # up to layer 3
    torch._dynamo.reset()
    counters.clear()
    warm_up_target(target, layer_ids)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    for shape, want in zip(later, eager, strict=True):
        torch.testing.assert_close(extract_context(target, *_batch(*shape), layer_ids), want)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled after warm-up
    uncompile_target_layers(target)
    assert all("forward" not in vars(layer) for layer in target.layers)
    assert not target_compile_wanted(target)  # CPU targets stay eager in the trainer


def test_drafter_shapes_are_the_first_distinct_padded_batch_shapes() -> None:
    lengths = [100, 300, 250, 700, 90, 5000]
    batches = [[0, 4], [1, 2], [0, 4], [3], [5]]
    assert drafter_shapes(lengths, batches, 2048) == [(2, 256), (2, 512)]
    assert drafter_shapes(lengths, batches, 2048, count=4) == [
        (2, 256),
        (2, 512),
        (1, 768),
        (1, 2048),
    ]


def test_warm_up_shapes_make_one_graph_for_all_rows_and_one_for_single_rows() -> None:
    """512 anchors x block 16: every batch has 8,192 padded queries; rows and padded key
    lengths vary. (3, 2000) compiles static; (2, 1300) differs in rows and length, so its
    graph takes every rows >= 2 and length, (2, 1900) and (4, 2048) included; one row is
    a graph of its own. (3, 1900) has the first batch's sizes: no pick of its own."""
    lengths = [1100, 2000, 1500, 1300, 1900, 1024, 1700, 1200, 2048, 1800]
    plan = [[0, 1, 2], [3, 4], [5], [6, 7, 8, 9], [0, 3], [2, 4, 6]]
    assert warm_up_shapes(lengths, plan, 2048, 512, 16) == [(3, 2000), (2, 1300), (1, 1024)]
    assert warm_up_shapes(lengths, plan, 2048, 512, 16, count=2) == [(3, 2000), (2, 1300)]
    assert warm_up_shapes(lengths, [[0, 1], [4, 8]], 2048, 512, 16) == [(2, 2000)]


def _static_only(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
    """A compiler backend that cannot compile symbolic sizes (as inductor might not)."""
    sizes = [d for x in inputs if isinstance(x, torch.Tensor) for d in x.shape]
    if any(isinstance(v, torch.SymInt) for v in [*inputs, *sizes]):
        raise NotImplementedError("symbolic sizes")
    return gm.forward


def test_drafter_warm_up_falls_back_to_static_graphs_and_reports_later_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    open_cpu_flex_backward(monkeypatch)
    for name, value in [("cpu_backend", _static_only), ("compiled", {}), ("dynamic", None)]:
        monkeypatch.setattr(_FlexState, name, value)
    torch.compiler.reset()
    drafter = tiny_drafter()
    drafter.attention_backend = "flex"
    stepper = tiny_stepper(drafter, num_anchors=80)
    events: list[dict[str, Any]] = []
    report = compile_before_workers(
        targets=[_fresh_tiny_target()], layer_ids=[1, 3], stepper=stepper,
        attention_backend="flex", shapes=[(2, 70), (4, 40), (1, 130)],
        emit=lambda kind, **fields: events.append({"kind": kind, **fields}),
    )  # fmt: skip
    # The second shape's graph is the dynamic one: it fails, the static retry warms two.
    assert [e["code"] for e in events] == ["compiling", "compile_failed", "compiled"]
    # A CPU target compiles no layers (CUDA targets only): the drafter's attention alone.
    assert events[0]["message"].endswith(": the drafter's attention for 3 batch shapes")
    assert "dynamic shapes (BackendCompilerFailed); compiling per shape" in events[1]["message"]
    assert report["shapes"] == [(2, 70), (4, 40)]
    assert events[2]["drafter_shapes"] == [[2, 70], [4, 40]]
    assert events[2]["drafter_dynamic"] is False and events[2]["drafter_graphs"] >= 2
    assert drafter.attention_backend == "flex"
    stepper.warm_up([(3, 300)], torch.float32)  # a new shape compiles, and says so
    # as it begins (the step waits meanwhile), and when it has ended
    later = [(e["code"], e["part"], e["shape"]) for e in events[3:]]
    assert later == [("compiling", "drafter_attention", [3, 4, 512, 8]),
                     ("compiled", "drafter_attention", [3, 4, 512, 8])]  # fmt: skip
    assert events[3]["message"] == (
        "drafter attention compiling mid-run for a shape the warm-up did not cover, "
        "[3, 4, 512, 8]: the step waits until it ends"
    )
    torch.compiler.reset()


def test_kernels_in_use_on_the_cpu() -> None:
    target = _fresh_tiny_target()
    kernels = kernels_in_use("auto", torch.device("cpu"), [target])
    assert kernels == {
        "attention": "sdpa",
        "drafter_layers": "eager",
        "lm_head_loss": "fused_chunked_ce",
        "ce_kernel": "eager",
        "target_layers": "eager",
        "target_dtype": "bf16",
        "target_layer_paths": {"full_attention": {"attention": "sdpa"}},
        "target_layer_compile": None,
    }


def test_the_compile_announcement_names_what_will_compile() -> None:
    from dflash_train.pipeline.compile_warm_up import _announce

    events: list[dict[str, Any]] = []
    emit = lambda kind, **fields: events.append({"kind": kind, **fields})  # noqa: E731
    _announce(emit, 7, True, True, 3)
    _announce(emit, 1, False, False, 0)
    _announce(emit, 0, False, False, 2)  # nothing compiles (a CPU run): nothing said
    assert [e["message"] for e in events] == [
        "compiling before the first step: the layers of 7 target replicas, the drafter's "
        "layers and attention for 3 batch shapes",
        "compiling before the first step: the layers of 1 target replica",
    ]
    assert events[0]["level"] == "info" and events[0]["target_replicas"] == 7


def test_the_compiled_event_gives_each_target_replica_s_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on a CUDA box (the CPU's targets stay eager in the trainer): two replicas, each
    replica's warm-up seconds in the event, so a box's later replicas show whether they
    reused the first one's kernels."""
    import functools

    from dflash_train.pipeline import compile_warm_up

    monkeypatch.setattr(compile_warm_up, "target_compile_wanted", lambda _t, wanted: wanted)
    compile_eager = functools.partial(compile_target_layers, backend="eager")
    monkeypatch.setattr(compile_warm_up, "compile_target_layers", compile_eager)
    torch.compiler.reset()
    targets = [_fresh_tiny_target(), _fresh_tiny_target()]
    events: list[dict[str, Any]] = []
    report = compile_before_workers(
        targets=targets, layer_ids=[1, 3], stepper=tiny_stepper(tiny_drafter(), num_anchors=8),
        attention_backend="sdpa", shapes=[],
        emit=lambda kind, **fields: events.append({"kind": kind, **fields}),
    )  # fmt: skip
    assert [e["code"] for e in events] == ["compiling", "compiled"]
    assert events[0]["message"].endswith(": the layers of 2 target replicas")
    each = events[1]["target_s_each"]
    assert len(each) == 2 and all(s > 0 for s in each) and report["target_s_each"] == each
    assert events[1]["target_s"] == pytest.approx(sum(each), abs=0.02)
    assert f"({each[0]:.1f}, {each[1]:.1f} s a replica)" in events[1]["message"]
    for target in targets:
        uncompile_target_layers(target)
    torch.compiler.reset()


def test_the_stream_says_when_the_target_is_done_and_the_drafter_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the target's compile and the drafter's (minutes each on a GPU) the stream
    says which part the warm-up is in, with the target's seconds."""
    import functools

    from dflash_train.pipeline import compile_warm_up

    open_cpu_flex_backward(monkeypatch)
    for name, value in [("cpu_backend", "eager"), ("compiled", {}), ("dynamic", None)]:
        monkeypatch.setattr(_FlexState, name, value)
    monkeypatch.setattr(compile_warm_up, "target_compile_wanted", lambda _t, wanted: wanted)
    compile_eager = functools.partial(compile_target_layers, backend="eager")
    monkeypatch.setattr(compile_warm_up, "compile_target_layers", compile_eager)
    torch.compiler.reset()
    target = _fresh_tiny_target()
    drafter = tiny_drafter()
    drafter.attention_backend = "flex"
    events: list[dict[str, Any]] = []
    report = compile_before_workers(
        targets=[target], layer_ids=[1, 3], stepper=tiny_stepper(drafter, num_anchors=80),
        attention_backend="flex", shapes=[(2, 70), (4, 40)],
        emit=lambda kind, **fields: events.append({"kind": kind, **fields}),
    )  # fmt: skip
    assert [e["code"] for e in events] == ["compiling", "compiling", "compiled"]
    progress = events[1]
    assert progress["part"] == "drafter" and progress["target_s"] == report["target_s"] > 0
    assert progress["message"] == (
        f"target layers compiled in {report['target_s']:.1f} s; now the drafter's attention "
        "for 2 batch shapes"
    )
    uncompile_target_layers(target)
    torch.compiler.reset()


def test_a_target_compile_mid_run_is_reported_once_per_new_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch shape the target's warm-up missed compiles in the worker, holding the pool
    (49 s on an H100's fp8 target, with no word in the stream): the stream now says so,
    once per new graph. Here the warm-up is made to miss the one-row shape."""
    import functools

    from dflash_train.data.buckets import Batch
    from dflash_train.pipeline import compile_warm_up
    from dflash_train.pipeline.stage_timers import StageTimers
    from dflash_train.pipeline.target_workers import (
        WARM_UP_SHAPES,
        LoadedBatch,
        forward_to_drafter,
    )

    monkeypatch.setattr(compile_warm_up, "target_compile_wanted", lambda _t, wanted: wanted)
    compile_eager = functools.partial(compile_target_layers, backend="eager")
    monkeypatch.setattr(compile_warm_up, "compile_target_layers", compile_eager)
    multi_row = [shape for shape in WARM_UP_SHAPES if shape[0] > 1]
    missing_one_row = functools.partial(warm_up_target, shapes=multi_row)
    monkeypatch.setattr(compile_warm_up, "warm_up_target", missing_one_row)
    torch.compiler.reset()
    target = _fresh_tiny_target()
    events: list[dict[str, Any]] = []
    compile_before_workers(
        targets=[target], layer_ids=[1, 3], stepper=tiny_stepper(tiny_drafter(), num_anchors=8),
        attention_backend="sdpa", shapes=[],
        emit=lambda kind, **fields: events.append({"kind": kind, **fields}),
    )  # fmt: skip
    try:
        assert [e["code"] for e in events] == ["compiling", "compiled"]
        for rows, length, padded in [(1, 75, False), (1, 90, False), (3, 60, True)]:
            ids, mask = _batch(rows, length, padded)
            item = LoadedBatch(0, Batch(ids, mask, mask), int(mask.sum()))
            forward_to_drafter(target, item, [1, 3], torch.device("cpu"), StageTimers())
        # As the compile begins, and when it has ended, once.
        later = events[2:]
        assert [(e["code"], e["part"], e["shape"]) for e in later] == [
            ("compiling", "target_layers", [1, 75]),
            ("compiled", "target_layers", [1, 75]),
        ]
        assert all(e["level"] == "info" for e in later) and later[1]["seconds"] > 0
        assert later[0]["message"] == (
            "target layers compiling mid-run for a shape the warm-up did not cover, [1, 75]: "
            "the pool waits until it ends"
        )
        assert later[1]["message"].startswith(
            "target layers compiled mid-run for a shape the warm-up did not cover, [1, 75], in "
        )
        # A run whose target is not compiled clears the hook an earlier run left.
        monkeypatch.setattr(compile_warm_up, "target_compile_wanted", lambda _t, _w: False)
        compile_before_workers(
            targets=[_fresh_tiny_target()], layer_ids=[1, 3],
            stepper=tiny_stepper(tiny_drafter(), num_anchors=8), attention_backend="sdpa",
            shapes=[], emit=lambda kind, **fields: None,
        )  # fmt: skip
        assert _Hooks.on_end is None
        assert _compile_started not in torch._dynamo.callback_handler.start_callbacks
    finally:
        uncompile_target_layers(target)
        torch.compiler.reset()
