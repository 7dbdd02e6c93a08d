"""Compiling a hybrid target's layers (issue 28): the linear-attention kernels sit behind
opaque ops (targets/kernel_ops.py), so the compiled hybrid gives the eager hidden states, one
graph per layer type and mask kind whatever the sequence length and the depth, and the graphs
stay the same where dynamo reads `torch.compiler.is_exporting()` as true (torch before 2.14,
which sent transformers' wrapper to its reference kernel on the H200)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from dflash_train.pipeline.target_workers import (
    WARM_UP_SHAPES,
    compile_target_layers,
    uncompile_target_layers,
    warm_up_target,
)
from dflash_train.targets import linear_attention as la
from dflash_train.targets.frozen_target import (
    Target,
    context_layer_count,
    extract_context,
    target_layer_ids,
)
from dflash_train.targets.presets import RANDOM_PRESETS, build_random_model

# Batch shapes after the warm-up: chunk counts (ceil(S/64)) the warm-up never saw, and a
# one-row batch of a length it never saw.
LATER = [(4, 97, True), (5, 131, False), (2, 700, True), (1, 450, False)]


def _hybrid(layers: int = 8) -> Target:
    torch.manual_seed(0)
    preset = RANDOM_PRESETS["tiny-hybrid"]
    preset = replace(preset, config=preset.config | {"num_hidden_layers": layers})
    model = build_random_model(preset, torch.device("cpu"), torch.float32)
    model.eval().requires_grad_(False)
    embed = model.get_input_embeddings()
    return Target(
        "random:tiny-hybrid", model, None, layers, 64, int(embed.weight.shape[0]), embed,
        model.get_output_embeddings(),
    )  # fmt: skip


def _layer_ids(target: Target) -> list[int]:
    return target_layer_ids(target.num_layers, context_layer_count(target.num_layers, None))


def _batch(rows: int, length: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(rows * 1000 + length)
    ids = torch.randint(0, 1000, (rows, length), generator=gen)
    if not padded:
        return ids, None
    mask = torch.ones_like(ids)
    mask[-1, length - length // 3 :] = 0
    return ids, mask


@pytest.fixture
def kernels_restored() -> Iterator[None]:
    """make_kernels_opaque swaps the hybrid modeling module's globals: put them back."""
    module = la._linear_attention_module(_hybrid(4).model)
    assert module is not None
    names = [name for name, _ in la.PARTS.values()]
    before = {name: getattr(module, name) for name in names}
    torch._dynamo.reset()
    yield
    for name in names:
        setattr(module, name, before[name])
    torch._dynamo.reset()


def _graph_sizes(target: Target) -> list[dict[str, int]]:
    """Compile with a backend that records, per graph, the count of each opaque op and of
    all nodes (dynamo's capture is real; the graphs then run as captured)."""
    graphs: list[dict[str, int]] = []

    def record(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        targets = [str(node.target).removesuffix(".default") for node in gm.graph.nodes]
        graphs.append({
            "nodes": len(targets),
            "gated_delta_rule": targets.count("dflash.chunk_gated_delta_rule"),
            "conv1d": targets.count("dflash.causal_conv1d"),
        })  # fmt: skip
        return gm.forward

    compile_target_layers(target, _layer_ids(target), backend=record)  # type: ignore[arg-type]
    return graphs


def test_the_compiled_hybrid_gives_the_eager_hidden_states(kernels_restored: None) -> None:
    """Inductor, fp32: every warm-up shape and the later ones, padded or not."""
    target = _hybrid()
    layer_ids = _layer_ids(target)
    shapes = [*WARM_UP_SHAPES, *LATER]
    eager = [extract_context(target, *_batch(*shape), layer_ids) for shape in shapes]
    compile_target_layers(target, layer_ids)
    try:
        for shape, want in zip(shapes, eager, strict=True):
            got = extract_context(target, *_batch(*shape), layer_ids)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=str(shape))
    finally:
        uncompile_target_layers(target)
    # Left behind the ops, the eager layers still compute what transformers' kernels did.
    torch.testing.assert_close(
        extract_context(target, *_batch(*LATER[0]), layer_ids), eager[len(WARM_UP_SHAPES)]
    )


def test_one_graph_per_layer_type_and_mask_kind_whatever_the_length_and_depth(
    kernels_restored: None,
) -> None:
    for layers in (8, 16):  # 6 then 14 layers compiled: 5 and 11 of them linear attention
        torch._dynamo.reset()
        target = _hybrid(layers)
        graphs = _graph_sizes(target)
        counters.clear()
        warm_up_target(target, _layer_ids(target))
        # {linear, full attention} x {mask tensor, no mask, one row}: no recompile per layer
        # (layer index, cache objects) nor per chunk count, and no graph break at the kernels.
        assert counters["stats"]["unique_graphs"] == 6, layers
        assert counters["frames"]["total"] == 6, layers
        assert not counters["graph_break"], dict(counters["graph_break"])
        for shape in LATER:
            extract_context(target, *_batch(*shape), _layer_ids(target))
        assert counters["stats"]["unique_graphs"] == 6, layers
        linear = [graph for graph in graphs if graph["gated_delta_rule"]]
        assert len(linear) == 3
        assert all(graph["gated_delta_rule"] == graph["conv1d"] == 1 for graph in linear)
        uncompile_target_layers(target)


def test_the_graphs_hold_no_reference_kernel_where_dynamo_reads_exporting_as_true(
    kernels_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.11's dynamo (the H200's) traced `is_exporting()` as true: the reference kernel
    then took its export branch, a Python loop over the chunk's rows. Made so here, the graphs
    are those of a torch that reads it right: the kernel is never traced."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    sizes = []
    for exporting in (False, True):
        if exporting:
            monkeypatch.setattr(
                modeling_qwen3_5, "is_torchdynamo_exporting", torch.compiler.is_compiling
            )
        torch._dynamo.reset()
        target = _hybrid()
        graphs = _graph_sizes(target)
        counters.clear()
        warm_up_target(target, _layer_ids(target), WARM_UP_SHAPES[:2])
        assert counters["stats"]["unique_graphs"] == 2
        sizes.append(sorted(graph["nodes"] for graph in graphs))
        uncompile_target_layers(target)
    assert sizes[0] == sizes[1]
    assert max(sizes[1]) < 200  # the layer's own ops; the traced reference was ~800 more


def test_a_hybrid_reports_what_its_compiled_layers_hold(kernels_restored: None) -> None:
    target = _hybrid()
    assert la.compiled_parts(target.model) == {
        "full_attention": "whole layer",
        "linear_attention": "whole layer; gated_delta_rule and conv1d as opaque ops, not traced",
    }
    assert la.make_kernels_opaque(target.model)
    module = la._linear_attention_module(target.model)
    wrapped = {name: getattr(module, name) for name, _ in la.PARTS.values()}
    assert la.make_kernels_opaque(target.model)  # idempotent: no op around an op
    assert {name: getattr(module, name) for name in wrapped} == wrapped
    # The kernels behind the ops are still read through them (CPU: the reference).
    assert la.layer_paths(target)["linear_attention"] == {
        "gated_delta_rule": "torch",
        "conv1d": "torch",
    }
    for name in wrapped:
        assert la._implementation(getattr(module, name)) == la.TORCH
    dense = build_random_model(RANDOM_PRESETS["tiny"], torch.device("cpu"), torch.float32)
    assert not la.make_kernels_opaque(dense)  # a dense target compiles as before
    assert la.compiled_parts(dense) == {"full_attention": "whole layer"}
