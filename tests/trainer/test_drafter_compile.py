"""The drafter's compiled pointwise stretches (model/drafter_compile.py) keep the eager
drafter's values and gradients, share their graphs across layers, compile only in the
warm-up for later batch shapes, and fall back to eager when compiling fails. Inductor runs
here for real (its C++ CPU codegen: ~35 s with a cold cache, a few seconds warm); the graph
accounting uses dynamo's 'eager' backend, which skips only the codegen."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from drafter_fixtures import frozen_head, random_context, tiny_drafter, tiny_stepper
from torch._dynamo.utils import counters

from dflash_train.model import drafter_compile
from dflash_train.model.compile_watch import set_hooks
from dflash_train.model.dflash_loss import dflash_forward_loss, sample_anchors
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.model.drafter_compile import (
    compile_drafter,
    drafter_compile_wanted,
    drafter_compiled,
    uncompile_drafter,
)
from dflash_train.pipeline import compile_warm_up
from dflash_train.pipeline.compile_warm_up import compile_before_workers, kernels_in_use


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch.compiler.reset()
    counters.clear()
    yield
    set_hooks()
    torch.compiler.reset()


def _step(drafter: DFlashDrafter, rows: int, length: int, seed: int = 0) -> dict[str, Any]:
    """Forward + backward of the loss on one made-up batch: the loss, the final hidden
    states, and every gradient (weights, and the context's)."""
    embed, head = frozen_head()
    context = random_context(rows, length, seed=seed).requires_grad_(True)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, embed.num_embeddings, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    anchors, valid = sample_anchors(mask, 6, drafter.config.block_size, gen)
    drafter.zero_grad(set_to_none=True)
    out = dflash_forward_loss(drafter, embed, head, context, ids, mask, anchors, valid)
    out.loss.backward()
    hidden = drafter(drafter.embed_blocks(embed, ids.gather(1, anchors)), context, anchors, valid)
    grads = {name: p.grad.clone() for name, p in drafter.named_parameters()}
    return {"loss": out.loss.detach(), "hidden": hidden.detach(), "context": context.grad, **grads}


def test_inductor_gives_the_eager_values_and_gradients_in_fp32() -> None:
    drafter = tiny_drafter(num_layers=2)
    eager = _step(drafter, 2, 30)
    assert compile_drafter(drafter) == 2 * 2 + 2  # two stretches a layer, two norms
    compiled = _step(drafter, 2, 30)
    assert counters["stats"]["unique_graphs"] == 3  # the layers share theirs
    assert eager.keys() == compiled.keys()
    for name, want in eager.items():
        torch.testing.assert_close(compiled[name], want, rtol=1e-5, atol=1e-6, msg=name)


def test_inductor_compiles_the_stretches_without_its_coalescing_analysis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The analysis asserts on these graphs in torch 2.11 (every layer fell back to eager on
    the H200): inductor gets it off, other backends get no options (they take none)."""
    seen: list[tuple[object, object]] = []
    real_compile = torch.compile

    def spy(fn: object, **kwargs: object) -> object:
        seen.append((kwargs["backend"], kwargs.get("options")))
        return real_compile(fn, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(torch, "compile", spy)
    compile_drafter(tiny_drafter(num_layers=1))
    compile_drafter(tiny_drafter(num_layers=1), backend="eager")
    off = {"triton.coalesce_tiling_analysis": False}
    assert seen == [("inductor", off)] * 4 + [("eager", None)] * 4


def test_compile_off_is_exactly_the_eager_path() -> None:
    drafter = tiny_drafter(num_layers=2)
    eager = _step(drafter, 3, 41)
    compile_drafter(drafter, backend="eager")
    assert drafter_compiled(drafter)
    uncompile_drafter(drafter)
    assert not drafter_compiled(drafter)
    counters.clear()
    again = _step(drafter, 3, 41)
    assert counters["stats"]["unique_graphs"] == 0  # nothing traced
    for name, want in eager.items():
        assert torch.equal(again[name], want), name
    # The trainer's rule: CUDA unless the config says no; the CPU stays eager.
    assert not drafter_compile_wanted(torch.device("cpu"))
    assert drafter_compile_wanted(torch.device("cuda"))
    assert not drafter_compile_wanted(torch.device("cuda"), wanted=False)
    assert kernels_in_use("sdpa", torch.device("cpu"), [])["drafter_layers"] == "eager"
    cuda = torch.device("cuda")
    assert kernels_in_use("sdpa", cuda, [])["drafter_layers"] == "compiled"
    assert kernels_in_use("sdpa", cuda, [], compile_drafter=False)["drafter_layers"] == "eager"


def test_one_graph_per_stretch_for_all_rows_and_one_for_single_rows() -> None:
    drafter = tiny_drafter(num_layers=3)
    compile_drafter(drafter, backend="eager")
    seen: list[tuple[str, tuple[int, ...]]] = []
    stretch = "drafter layers' "
    set_hooks(on_end=lambda _p, what, shape, _s: seen.append((what.removeprefix(stretch), shape)))
    graphs = []
    for rows, length in [(2, 30), (3, 41), (4, 24), (1, 25), (1, 37), (5, 60)]:
        _step(drafter, rows, length)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [3, 3, 3, 6, 6, 6]
    assert [part for part, _ in seen] == ["forward", "attention_inputs",
                                          "attention_output_and_mlp"] * 2  # fmt: skip
    assert {shape[0] for _, shape in seen} == {2, 1}


def _trainer_compiles(monkeypatch: pytest.MonkeyPatch, backend: Any) -> None:
    """compile_before_workers as on a CUDA drafter, with `backend` for inductor."""
    monkeypatch.setattr(compile_warm_up, "drafter_compile_wanted", lambda _d, wanted: wanted)
    compile_with = functools.partial(drafter_compile.compile_drafter, backend=backend)
    monkeypatch.setattr(compile_warm_up, "compile_drafter", compile_with)


def _warm(stepper: Any, shapes: list[tuple[int, int]], events: list[dict[str, Any]]) -> Any:
    return compile_before_workers(
        targets=[], layer_ids=[1, 3], stepper=stepper, attention_backend="sdpa",
        shapes=shapes, emit=lambda kind, **fields: events.append({"kind": kind, **fields}),
    )  # fmt: skip


def test_warm_up_compiles_the_layers_for_every_later_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _trainer_compiles(monkeypatch, "eager")
    drafter = tiny_drafter(num_layers=2)
    stepper = tiny_stepper(drafter, num_anchors=8)
    events: list[dict[str, Any]] = []
    report = _warm(stepper, [(2, 70), (1, 40)], events)
    assert report["drafter_layers_compiled"] and report["drafter_graphs"] == 6
    # Said before the minutes it can take, and what it did after.
    assert [e["code"] for e in events] == ["compiling", "compiled"]
    assert events[0]["message"] == (
        "compiling before the first step: the drafter's layers for 2 batch shapes"
    )
    assert events[1]["drafter_layers_compiled"] is True
    assert "drafter layers " in events[1]["message"]
    graphs = counters["stats"]["unique_graphs"]
    stepper.warm_up([(3, 50), (1, 90), (5, 33)], torch.float32)
    assert counters["stats"]["unique_graphs"] == graphs
    assert len(events) == 2  # no mid-run compile to report


def _refuse(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
    raise NotImplementedError("no kernel for this op")


def test_a_failed_layer_compile_runs_the_layers_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    _trainer_compiles(monkeypatch, _refuse)
    drafter = tiny_drafter()
    stepper = tiny_stepper(drafter, num_anchors=8)
    events: list[dict[str, Any]] = []
    report = _warm(stepper, [(2, 70)], events)
    assert [e["code"] for e in events] == ["compiling", "compile_failed"]
    assert "running them eagerly" in events[1]["message"]
    assert not drafter_compiled(drafter) and report["drafter_s"] is None
    assert all(p.grad is None for p in drafter.parameters())  # the failed warm-up's dropped
    stepper.warm_up([(2, 40)], torch.float32)  # and steps still run


def test_a_layer_compile_mid_run_is_said_as_it_begins_and_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shape the warm-up missed (here one row) compiles in the drafter's step: each compiled
    stretch says so as its compile begins, then how long it took."""
    _trainer_compiles(monkeypatch, "eager")
    drafter = tiny_drafter(num_layers=2)
    stepper = tiny_stepper(drafter, num_anchors=8)
    events: list[dict[str, Any]] = []
    try:
        _warm(stepper, [(2, 70)], events)
        stepper.warm_up([(1, 40)], torch.float32)
        later = [(e["code"], e["part"], e["shape"][0]) for e in events[2:]]
        stretches = ["forward", "attention_inputs", "attention_output_and_mlp"]
        # Once each (the second layer shares the first one's graphs), begun then ended.
        assert later == [
            (code, "drafter_layers", 1) for _ in stretches for code in ("compiling", "compiled")
        ]
        begun = [e["message"] for e in events[2:] if e["code"] == "compiling"]
        assert [m.split(" compiling mid-run")[0] for m in begun] == [
            f"drafter layers' {part}" for part in stretches
        ]
        assert all(m.endswith(": the step waits until it ends") for m in begun)
    finally:
        set_hooks()


def test_a_start_hook_that_fails_never_fails_the_compile(caplog: pytest.LogCaptureFixture) -> None:
    from dflash_train.model.compile_watch import watching

    def broken(_part: str, _what: str, _shape: tuple[int, ...]) -> None:
        raise RuntimeError("the stream is gone")

    double = torch.compile(lambda x: x * 2, backend="eager")
    set_hooks(broken)
    try:
        with watching("drafter_layers", "drafter layers' forward", (3,)):
            out = double(torch.ones(3))
    finally:
        set_hooks()
    assert out.tolist() == [2.0, 2.0, 2.0]
    assert "compile_watch: the start hook failed" in caplog.text
