"""The asynchronous checkpointer writes the state of the step boundary, whatever training
does meanwhile, through the same atomic save; a failed write is raised on the next wait."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from drafter_fixtures import tiny_drafter

from dflash_train.checkpoint import store as checkpoints
from dflash_train.model.drafter import load_drafter
from dflash_train.pipeline.async_checkpoint import AsyncCheckpointer


def _state(step: int) -> checkpoints.TrainState:
    return checkpoints.TrainState(step=step, epoch=0, consumed=[1, 2], tokens_seen=7, run_id="r")


def test_writes_the_captured_state_while_training_goes_on(tmp_path: Path) -> None:
    drafter = tiny_drafter(num_layers=2)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)

    def train_step() -> None:
        loss = sum((p.float() ** 2).sum() for p in drafter.parameters())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    train_step()
    done: list[tuple[int, float]] = []
    saver = AsyncCheckpointer(
        drafter, optimizer, scheduler,
        on_done=lambda path, state, stall, write: done.append((state.step, write)),
        on_error=lambda state, exc: None,
    )  # fmt: skip
    want = {k: v.clone() for k, v in drafter.state_dict().items()}
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    saver.save(tmp_path, _state(1), checkpoints.capture_rng([]), keep=2)
    for _ in range(3):  # the weights move on while the write runs
        train_step()
    saver.wait()
    assert [step for step, _ in done] == [1]
    path = checkpoints.latest_checkpoint(tmp_path)
    assert path is not None and checkpoints.is_complete(path)
    saved = load_drafter(path).state_dict()
    for name, value in want.items():
        assert torch.equal(saved[name], value), name
    loaded = checkpoints.load_checkpoint(path)
    assert torch.equal(loaded.optimizer["state"][0]["exp_avg"], moments)
    assert loaded.state.step == 1 and loaded.state.consumed == [1, 2]
    # The host buffers are reused: a second save holds the newer weights.
    saver.save(tmp_path, _state(2), checkpoints.capture_rng([]), keep=2)
    saver.wait()
    newest = checkpoints.latest_checkpoint(tmp_path)
    assert newest is not None and newest.name == "step_0000002"
    for name, value in drafter.state_dict().items():
        assert torch.equal(load_drafter(newest).state_dict()[name], value), name


def test_a_failed_write_is_raised_on_the_next_wait(tmp_path: Path) -> None:
    drafter = tiny_drafter()
    optimizer = torch.optim.AdamW(drafter.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    errors: list[BaseException] = []
    saver = AsyncCheckpointer(
        drafter, optimizer, scheduler,
        on_done=lambda *a: None, on_error=lambda state, exc: errors.append(exc),
    )  # fmt: skip
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the checkpoint root cannot be created here
    saver.save(blocker, _state(1), checkpoints.capture_rng([]), keep=1)
    with pytest.raises(Exception):  # noqa: B017 (whatever save_checkpoint raised)
        saver.wait()
    assert len(errors) == 1
    saver.wait()  # raised once only
