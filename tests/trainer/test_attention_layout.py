"""The fast paths against their references, in float32 on the CPU: the block-sparse flex
layout covers exactly the dense mask, the flex drafter gives the dense drafter's loss and
gradients, and the fused lm_head cross-entropy equals plain cross-entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from drafter_fixtures import (
    VOCAB,
    frozen_head,
    open_cpu_flex_backward,
    random_context,
    tiny_drafter,
    tiny_stepper,
)

from dflash_train.model import dflash_loss, liger_ce
from dflash_train.model.attention_layout import (
    KERNEL_OPTIONS,
    TILE,
    _FlexState,
    dense_mask,
    flex_layout,
    kernel_options,
    resolve_backend,
)
from dflash_train.model.compile_watch import set_hooks
from dflash_train.model.dflash_loss import dflash_forward_loss, linear_cross_entropy, sample_anchors
from dflash_train.pipeline.compile_warm_up import warm_up_shapes


def _tiles(num: torch.Tensor, idx: torch.Tensor, kv_tiles: int) -> torch.Tensor:
    """BlockMask (counts, indices) -> [B, q_tiles, kv_tiles] bool of the listed tiles."""
    b, _, q_tiles = num.shape
    out = torch.zeros(b, q_tiles, kv_tiles, dtype=torch.bool)
    for bi in range(b):
        for t in range(q_tiles):
            out[bi, t, idx[bi, 0, t, : num[bi, 0, t]].long()] = True
    return out


@pytest.mark.parametrize(("length", "blocks", "size"), [(300, 24, 16), (77, 9, 4), (520, 20, 12)])
def test_flex_block_mask_is_the_dense_mask(length: int, blocks: int, size: int) -> None:
    gen = torch.Generator().manual_seed(length)
    loss_mask = (torch.rand(3, length, generator=gen) > 0.3).long()
    anchors, valid = sample_anchors(loss_mask, blocks, size, gen)
    valid[1, :3] = False  # some invalid anchors among valid ones
    layout = flex_layout(anchors, valid, length, size)
    bm = layout.block_mask
    sp, qp = layout.padded_context, layout.padded_queries
    assert sp % TILE == 0 and qp % TILE == 0 and sp >= length and qp >= blocks * size
    # The padded dense mask: real queries see what dense_mask says, padded keys nothing.
    dense = dense_mask(anchors, valid, length, size)[:, 0]
    q = blocks * size
    want = torch.zeros(3, qp, sp + qp, dtype=torch.bool)
    want[:, :q, :length] = dense[:, :, :length]
    want[:, :q, sp : sp + q] = dense[:, :, length:]
    # mask_mod, evaluated everywhere, says the same for the real queries.
    qi = torch.arange(qp)[:, None]
    ki = torch.arange(sp + qp)[None, :]
    got = torch.stack([bm.mask_mod(b, 0, qi, ki) for b in range(3)])
    assert torch.equal(got[:, :q], want[:, :q])
    kv_tiles = (sp + qp) // TILE
    partial = _tiles(bm.kv_num_blocks, bm.kv_indices, kv_tiles)
    full = _tiles(bm.full_kv_num_blocks, bm.full_kv_indices, kv_tiles)
    assert not (partial & full).any()
    per_tile = want.view(3, qp // TILE, TILE, kv_tiles, TILE)
    some = per_tile.any(dim=(2, 4))
    every = per_tile.all(dim=4).all(dim=2)
    # Every allowed pair is in a listed tile; full tiles are wholly allowed; no listed
    # tile is empty of allowed pairs except block tiles of padded queries.
    assert not (some & ~(partial | full)).any()
    assert torch.equal(full, full & every)
    real_tiles = torch.arange(qp // TILE) * TILE < q
    assert not (partial & ~some)[:, real_tiles].any()


def _loss_and_grads(drafter: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple:
    embed, head = frozen_head()
    drafter.zero_grad(set_to_none=True)
    out = dflash_forward_loss(drafter, embed, head, **batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
    return out, grads


def _batch(rows: int, length: int, anchors: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, length), generator=gen)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[0, : length // 4] = 0
    loss_mask[-1, length - length // 4 :] = 0
    anchor_ids, valid = sample_anchors(loss_mask, anchors, 4, gen)
    return {
        "context": random_context(rows, length, seed=seed),
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "anchors": anchor_ids,
        "valid": valid,
    }


def _assert_flex_equals_dense(drafter: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
    drafter.attention_backend = "sdpa"
    dense, dense_grads = _loss_and_grads(drafter, batch)
    drafter.attention_backend = "flex"
    flex, flex_grads = _loss_and_grads(drafter, batch)
    torch.testing.assert_close(flex.loss, dense.loss, rtol=1e-6, atol=1e-6)
    assert torch.equal(flex.slot_correct, dense.slot_correct)
    assert dense_grads.keys() == flex_grads.keys() and len(dense_grads) > 5
    for name, grad in dense_grads.items():
        torch.testing.assert_close(flex_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_flex_drafter_gives_the_dense_loss_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole flex path (padding, block mask, mask_mod) through flex_attention's own
    math backward."""
    open_cpu_flex_backward(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    length = 40
    input_ids = torch.randint(0, VOCAB, (2, length), generator=gen)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[0, :10] = 0
    loss_mask[1, 30:] = 0
    anchors, valid = sample_anchors(loss_mask, 6, 4, gen)
    batch = {
        "context": random_context(2, length),
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "anchors": anchors,
        "valid": valid,
    }
    _assert_flex_equals_dense(tiny_drafter(num_layers=2), batch)


def test_compiled_flex_warm_up_leaves_no_compile_for_later_rows_and_lengths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trainer's warm-up (the shapes warm_up_shapes picks from an epoch plan, run by
    DrafterStepper.warm_up) leaves a compiled graph for every later batch: new rows counts,
    new padded lengths, new query counts, one row. Dynamo's graph capture and AOTAutograd
    are the real ones; 'aot_eager' runs the captured graphs eagerly (inductor's CPU flex
    kernel has no backward). The compiled path still gives the dense loss and gradients."""
    from torch._dynamo.utils import counters

    open_cpu_flex_backward(monkeypatch)
    monkeypatch.setattr(_FlexState, "cpu_backend", "aot_eager")
    monkeypatch.setattr(_FlexState, "compiled", {})
    torch.compiler.reset()
    anchors = 80  # below 64 tokens a row has fewer anchors: 256 padded queries, else 512
    lengths = [70, 66, 300, 120, 130, 40, 35, 38, 30, 400, 450, 40, 130, 100, 90, 80]
    plan = [[0, 1], [2, 3, 4], [4], [5, 6, 7, 8], [9, 10], [11], [12, 13, 14, 15], [0, 15]]
    shapes = warm_up_shapes(lengths, plan, 400, anchors, 4)
    # The first batch (a static graph), one that differs in every size (one graph for
    # every rows >= 2), one single-row batch (dynamo specialises a size of 1).
    assert shapes == [(2, 70), (4, 40), (1, 130)]
    drafter = tiny_drafter()
    drafter.attention_backend = "flex"
    stepper = tiny_stepper(drafter, anchors)
    counters.clear()
    stepper.warm_up(shapes, torch.float32)
    assert counters["stats"]["unique_graphs"] >= 1
    warm = counters["stats"]["unique_graphs"]
    compiles: list[tuple[int, ...]] = []
    set_hooks(on_end=lambda _part, _what, shape, _s: compiles.append(shape))
    try:
        for seed, (rows, length) in enumerate([(3, 300), (5, 130), (2, 400), (1, 40), (6, 90)]):
            _assert_flex_equals_dense(drafter, _batch(rows, length, anchors, seed))
    finally:
        set_hooks()
    assert counters["stats"]["unique_graphs"] == warm, compiles
    assert not compiles
    torch.compiler.reset()


def _unweighted_ce_and_grad_in_place(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What liger_ce.ce_and_grad_in_place returns, on a CPU (Liger's kernel is Triton on a
    GPU, where bench/ce_chunk.py checks it against _ce_and_grad)."""
    ones = torch.ones(logits.shape[0])
    ce, correct, grad = dflash_loss._ce_and_grad(logits, labels, ones)
    return ce, correct, logits.copy_(grad)


@pytest.mark.parametrize("kernel", ["inductor", "liger"])
def test_fused_cross_entropy_equals_plain_cross_entropy(
    monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """Both chunk kernels' ways to weight rows give F.cross_entropy's loss and gradients: the
    compiled kernel weights the logits' gradient, Liger's leaves it unweighted and the rows of
    the [rows, hidden] products are weighted instead."""
    monkeypatch.setattr(dflash_loss, "LOGIT_ELEMENTS_PER_CHUNK", 7 * VOCAB)  # several chunks
    if kernel == "liger":
        monkeypatch.setattr(dflash_loss, "_use_liger", lambda _logits, teacher: teacher is None)
        monkeypatch.setattr(
            dflash_loss.liger_ce, "ce_and_grad_in_place", _unweighted_ce_and_grad_in_place
        )
    gen = torch.Generator().manual_seed(3)
    _, head = frozen_head()
    head.requires_grad_(True)  # also check the weight gradient, which a target never needs
    hidden = torch.randn(30, head.in_features, generator=gen, requires_grad=True)
    labels = torch.randint(0, VOCAB, (30,), generator=gen)
    weights = torch.rand(30, generator=gen)
    weights[[0, 4, 5, 29]] = 0.0  # rows without loss skip the lm_head
    total, ce, correct = linear_cross_entropy(hidden, head, labels, weights)
    (total * 0.37).backward()
    got = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad = head.weight.grad = None
    logits = head(hidden)
    ref_ce = F.cross_entropy(logits, labels, reduction="none")
    ((ref_ce * weights).sum() * 0.37).backward()
    kept = weights != 0
    torch.testing.assert_close(total, (ref_ce * weights).sum())
    torch.testing.assert_close(ce[kept], ref_ce[kept].detach())
    assert torch.equal(correct[kept], (logits.argmax(-1) == labels).float()[kept])
    assert not ce[~kept].any() and not correct[~kept].any()
    torch.testing.assert_close(got[0], hidden.grad)
    torch.testing.assert_close(got[1], head.weight.grad)


def test_ce_kernel_choice() -> None:
    """An unknown kernel is refused by name; liger is never picked on a CPU, nor for a
    distilled loss; an explicit liger where it cannot run is refused in one line."""
    with pytest.raises(ValueError, match="ce kernel: 'apex' is not one of auto, inductor, liger"):
        dflash_loss.set_ce_kernel("apex")
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    liger = liger_ce.available()  # liger-kernel, Triton and a GPU
    try:
        for name in ("liger", "auto"):
            dflash_loss.set_ce_kernel(name)
            assert not dflash_loss._use_liger(torch.zeros(2, 3), None)
            assert dflash_loss.ce_kernel_in_use(cpu) == "eager"
            assert dflash_loss.ce_kernel_in_use(gpu) == ("liger" if liger else "inductor")
            assert dflash_loss.ce_kernel_in_use(gpu, distill=0.5) == "inductor"
        dflash_loss.set_ce_kernel("inductor")
        assert dflash_loss.ce_kernel_in_use(gpu) == "inductor"
    finally:
        dflash_loss.set_ce_kernel("auto")
    assert dflash_loss.ce_kernel_refusal("auto", cpu) is None
    assert dflash_loss.ce_kernel_refusal("inductor", cpu) is None
    if not liger:
        assert dflash_loss.ce_kernel_refusal("liger", cpu) == (
            "ce_kernel (--ce-kernel): liger runs on a GPU; the drafter is on cpu"
        )


def test_wide_heads_take_eight_backward_warps() -> None:
    """Measured on the trainer's own mask (bench/flex_tiles.py): 27 % off flex's backward at
    head_dim 256, bit-identical; nothing at 128, so smaller heads keep torch's choice."""
    assert kernel_options(256) == {**KERNEL_OPTIONS, "bwd_num_warps": 8}
    assert kernel_options(128) == kernel_options(64) == KERNEL_OPTIONS == {"IS_DIVISIBLE": True}


def test_cpu_auto_is_sdpa_and_unknown_backends_are_refused() -> None:
    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu) == "sdpa"
    assert resolve_backend("flex", cpu) == "flex"  # eager flex: the CPU reference above
    with pytest.raises(ValueError, match="attention backend"):
        resolve_backend("xformers", cpu)


def test_flex_autotune_compiles_inductor_flex_in_max_autotune(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """set_flex_autotune reaches torch.compile's mode for inductor (the GPU's compile, timed
    by bench/profile_drafter.py --flex-autotune) and drops the kernels compiled before it;
    other backends take no mode (torch.compile accepts one for inductor only), and the
    compiled flex still gives the dense loss."""
    from dflash_train.model import attention_layout

    seen: list[tuple[object, str | None]] = []
    real_compile = torch.compile

    def spy(fn: object, **kwargs: object) -> object:
        seen.append((kwargs["backend"], kwargs.get("mode")))  # type: ignore[arg-type]
        return real_compile(fn, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(torch, "compile", spy)
    monkeypatch.setattr(_FlexState, "compiled", {"inductor": object()})
    monkeypatch.setattr(_FlexState, "mode", None)
    attention_layout.set_flex_autotune(True)
    assert attention_layout.flex_compile_mode() == "max-autotune-no-cudagraphs"
    assert _FlexState.compiled == {}  # compiled before: not reused with the old mode
    attention_layout._compiled_flex("inductor")
    attention_layout._compiled_flex("aot_eager")
    assert seen == [("inductor", "max-autotune-no-cudagraphs"), ("aot_eager", None)]
    open_cpu_flex_backward(monkeypatch)
    monkeypatch.setattr(_FlexState, "cpu_backend", "aot_eager")
    torch.compiler.reset()
    drafter = tiny_drafter(num_layers=2)
    _assert_flex_equals_dense(drafter, _batch(2, 70, 16, 0))
    attention_layout.set_flex_autotune(False)
    assert attention_layout.flex_compile_mode() is None and _FlexState.compiled == {}
    torch.compiler.reset()
