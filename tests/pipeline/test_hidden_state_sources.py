"""The hidden-state sources on real parts: the random tiny target (two replicas, two worker
threads), the prepared dataset, the real collate. Every epoch hands out each batch exactly
once, the pool never holds more than its depth, and no thread outlives its epoch."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from dflash_train.data.buckets import bucketed_batches, length_buckets
from dflash_train.data.dataset import load_dataset_dir
from dflash_train.pipeline.pool import HiddenStatePool
from dflash_train.pipeline.sources import AsyncSource, BatchLoader, EpochPlan, SyncSource
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.targets.frozen_target import Target, load_target

LAYERS = [2]


@pytest.fixture(scope="module")
def parts(prepared_data_dir: Path, smollm2_target: Path) -> tuple[BatchLoader, list[Target]]:
    torch.set_num_threads(1)
    dataset = load_dataset_dir(prepared_data_dir)
    targets = []
    for _ in range(2):
        torch.manual_seed(0)
        targets.append(load_target("random:tiny", "cpu", torch.float32))
    buckets = length_buckets(dataset.lengths, 2)
    loader = BatchLoader(dataset, 128, 0, buckets, pin=False, timers=StageTimers())
    return loader, targets


def _plan(loader: BatchLoader, epoch: int) -> EpochPlan:
    order = bucketed_batches(
        loader.dataset.lengths, tokens_per_batch=256, epoch=epoch, seed=0, num_buckets=2
    )
    return EpochPlan(epoch, order, list(range(len(order))))


def test_async_epochs_hand_out_every_batch_once(
    parts: tuple[BatchLoader, list[Target]],
) -> None:
    loader, targets = parts
    pool: HiddenStatePool = HiddenStatePool(depth=3, min_ready=2, seed=0)
    source = AsyncSource(
        loader,
        targets,
        layer_ids=LAYERS,
        drafter_device=torch.device("cpu"),
        timers=StageTimers(),
        pool=pool,
    )
    sync = SyncSource(
        loader,
        targets[0],
        layer_ids=LAYERS,
        drafter_device=torch.device("cpu"),
        timers=StageTimers(),
    )
    before = threading.active_count()
    for epoch in range(3):
        plan = _plan(loader, epoch)
        seen = []
        for batch in source.batches(plan, lambda: False):
            assert pool.stats().ready <= 3
            rows, width = batch.input_ids.shape
            assert batch.context.shape == (rows, width, targets[0].hidden_size)
            assert not batch.context.is_inference()  # the drafter may keep it for backward
            seen.append(batch.position)
        assert sorted(seen) == plan.positions, f"epoch {epoch}"
        assert threading.active_count() == before
    # The async and sync sources compute the same hidden states for the same batch.
    plan = _plan(loader, 0)
    one = next(b for b in sync.batches(plan, lambda: False))
    again = next(b for b in source.batches(EpochPlan(0, plan.order, [one.position]), lambda: False))
    assert torch.equal(one.context, again.context)
    source.close()


def test_async_stop_mid_epoch_joins_every_thread(
    parts: tuple[BatchLoader, list[Target]],
) -> None:
    loader, targets = parts
    pool: HiddenStatePool = HiddenStatePool(depth=2, min_ready=1)
    source = AsyncSource(
        loader,
        targets,
        layer_ids=LAYERS,
        drafter_device=torch.device("cpu"),
        timers=StageTimers(),
        pool=pool,
    )
    before = threading.active_count()
    stop = threading.Event()
    taken = 0
    for _ in source.batches(_plan(loader, 0), stop.is_set):
        taken += 1
        stop.set()
    assert taken == 1
    assert threading.active_count() == before
    assert pool.stats().ready == 0  # closed: nothing held
