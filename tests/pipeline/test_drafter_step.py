"""DrafterStepper: real optimizer steps on CPU; non-finite steps are skipped on the device
and counted; metrics come out only through snapshots."""

from __future__ import annotations

import math

import torch
from tiny_parts import BLOCK, hidden_batch, timers, tiny_drafter

from dflash_train.pipeline.drafter_step import DrafterStepper, StepConfig, decode_interval
from dflash_train.pipeline.target_workers import HiddenBatch


def _stepper(lr: float = 1e-2) -> DrafterStepper:
    drafter, embed, head = tiny_drafter()
    config = StepConfig(
        lr=lr,
        weight_decay=0.01,
        warmup_steps=2,
        total_steps=20,
        grad_clip=1.0,
        block_size=BLOCK,
        num_anchors=4,
        seed=0,
    )
    return DrafterStepper(
        drafter,
        drafter,
        embed_tokens=embed,
        lm_head=head,
        config=config,
        device=torch.device("cpu"),
        timers=timers(),
    )


def _weights(stepper: DrafterStepper) -> list[torch.Tensor]:
    return [p.detach().clone() for p in stepper.drafter.parameters()]


def test_steps_lower_the_loss_and_snapshot_resets() -> None:
    torch.set_num_threads(1)
    stepper = _stepper()
    batch = hidden_batch(0)
    losses = []
    for _ in range(12):
        stepper.step(batch, epoch=0)
        figures = decode_interval(stepper.snapshot().wait(), BLOCK)
        assert figures.steps == 1 and figures.bad_steps == 0
        losses.append(figures.loss)
    assert all(isinstance(v, float) and math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert len(figures.slot_acc) == BLOCK - 1
    empty = decode_interval(stepper.snapshot().wait(), BLOCK)
    assert empty.steps == 0 and empty.loss is None


def test_non_finite_step_leaves_weights_and_moments_untouched() -> None:
    torch.set_num_threads(1)
    stepper = _stepper()
    stepper.step(hidden_batch(0), epoch=0)
    before = _weights(stepper)
    moments = [s["exp_avg"].clone() for s in stepper.optimizer.state.values()]
    good = hidden_batch(1)
    poisoned = HiddenBatch(**{**good.__dict__, "context": good.context * float("nan")})
    stepper.step(poisoned, epoch=0)
    stepper.step(poisoned, epoch=0)
    after = _weights(stepper)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(
        torch.equal(m, s["exp_avg"])
        for m, s in zip(moments, stepper.optimizer.state.values(), strict=True)
    )
    figures = decode_interval(stepper.snapshot().wait(), BLOCK)
    assert (figures.steps, figures.bad_steps, figures.max_streak) == (3, 2, 2)
    assert figures.loss is not None and math.isfinite(figures.loss)  # the good step only
    stepper.step(good, epoch=0)  # a good step after bad ones trains again, streak resets
    assert not all(torch.equal(a, b) for a, b in zip(after, _weights(stepper), strict=True))
    figures = decode_interval(stepper.snapshot().wait(), BLOCK)
    assert (figures.bad_steps, figures.max_streak) == (0, 0)


def test_anchors_depend_on_batch_position_not_draw_order() -> None:
    torch.set_num_threads(1)
    a, b = _stepper(), _stepper()
    batches = [hidden_batch(i) for i in range(3)]
    for batch in batches:
        a.step(batch, epoch=1)
    for batch in batches:
        b.step(batch, epoch=1)
    assert decode_interval(a.snapshot().wait(), BLOCK) == decode_interval(
        b.snapshot().wait(), BLOCK
    )
