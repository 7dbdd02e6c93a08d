"""Where the drafter's (batch, hidden states) pairs come from. `SyncSource` runs the target
inline; `AsyncSource` runs a loader thread and one TargetWorker per target device feeding a
HiddenStatePool. The training loop is the same for both."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_train.pipeline.pool import HiddenStatePool
from dflash_train.pipeline.target_workers import (
    END_OF_EPOCH,
    FinishCounter,
    HiddenBatch,
    LoadedBatch,
    TargetWorker,
    forward_to_drafter,
)

if TYPE_CHECKING:
    import torch

    from dflash_train.data.dataset import TokenDataset
    from dflash_train.pipeline.stage_timers import StageTimers
    from dflash_train.targets.frozen_target import Target


@dataclass(frozen=True)
class EpochPlan:
    """One epoch for this rank: `order` is the epoch's batches (sample indices) and
    `positions` the indices into `order` still to train, in order."""

    epoch: int
    order: list[list[int]]
    positions: list[int]


@dataclass(frozen=True)
class BatchLoader:
    """Collates the epoch's batches on the host (pinned when a GPU will read them)."""

    dataset: TokenDataset
    max_length: int
    pad_id: int
    buckets: Sequence[int]
    pin: bool
    timers: StageTimers

    def load(self, plan: EpochPlan, position: int) -> LoadedBatch:
        from dflash_train.data.buckets import collate

        indices = plan.order[position]
        with self.timers.time("load"):
            batch = collate(
                self.dataset,
                indices,
                self.max_length,
                self.pad_id,
                bucket=int(self.buckets[indices[0]]),
            )
            tokens = int(batch.attention_mask.sum())
            if self.pin:
                batch = batch.pin_memory()
        return LoadedBatch(position, batch, tokens)


class SyncSource:
    """Load, target forward, copy, hand over: one batch at a time, on the calling thread."""

    name = "sync"

    def __init__(
        self,
        loader: BatchLoader,
        target: Target,
        *,
        layer_ids: Sequence[int],
        drafter_device: torch.device,
        timers: StageTimers,
    ) -> None:
        self.loader = loader
        self.target = target
        self.layer_ids = list(layer_ids)
        self.drafter_device = drafter_device
        self.timers = timers
        self.pool: HiddenStatePool[HiddenBatch] | None = None

    def batches(self, plan: EpochPlan, should_stop: Callable[[], bool]) -> Iterator[HiddenBatch]:
        for position in plan.positions:
            if should_stop():
                return
            item = self.loader.load(plan, position)
            yield forward_to_drafter(
                self.target, item, self.layer_ids, self.drafter_device, self.timers
            )

    def close(self) -> None:
        pass


class AsyncSource:
    """Loader thread → bounded inbox → one TargetWorker per target → pool → drafter.
    Threads live for one epoch; the pool drains at its end, and everything is bounded."""

    name = "async"

    def __init__(
        self,
        loader: BatchLoader,
        targets: Sequence[Target],
        *,
        layer_ids: Sequence[int],
        drafter_device: torch.device,
        timers: StageTimers,
        pool: HiddenStatePool[HiddenBatch],
    ) -> None:
        self.loader = loader
        self.targets = list(targets)
        self.layer_ids = list(layer_ids)
        self.drafter_device = drafter_device
        self.timers = timers
        self.pool = pool
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def batches(self, plan: EpochPlan, should_stop: Callable[[], bool]) -> Iterator[HiddenBatch]:
        self.pool.start_epoch(plan.epoch)
        # Two loaded batches per worker keep them busy without holding much host memory.
        inbox: queue.Queue[LoadedBatch | None] = queue.Queue(maxsize=2 * len(self.targets))
        finished = FinishCounter(len(self.targets))
        workers = [
            TargetWorker(
                f"target-{i}",
                target,
                inbox=inbox,
                pool=self.pool,
                layer_ids=self.layer_ids,
                drafter_device=self.drafter_device,
                timers=self.timers,
                finished=finished,
            )
            for i, target in enumerate(self.targets)
        ]
        loader = threading.Thread(
            target=self._load_epoch, args=(plan, inbox, len(workers)), name="loader", daemon=True
        )
        self._threads = [loader, *workers]
        for thread in self._threads:
            thread.start()

        def stopped() -> bool:
            return self._stop.is_set() or should_stop()

        drained = False
        try:
            while True:
                item = self.pool.take(stopped)
                if item is None:
                    drained = not stopped()
                    break
                yield item
        finally:
            # Drained: every thread is past its last put and ends by itself. Anything else
            # (a stop, an error, the consumer leaving early) must wake blocked threads.
            if not drained:
                self._shutdown(inbox)
            self._join()

    def _load_epoch(self, plan: EpochPlan, inbox: queue.Queue[Any], workers: int) -> None:
        try:
            for position in plan.positions:
                item = self.loader.load(plan, position)
                if not self._put(inbox, item):
                    return
        except BaseException as exc:
            self.pool.fail(exc)
            return
        for _ in range(workers):
            if not self._put(inbox, END_OF_EPOCH):
                return

    def _put(self, inbox: queue.Queue[Any], item: Any) -> bool:
        while not self._stop.is_set():
            try:
                inbox.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _shutdown(self, inbox: queue.Queue[Any]) -> None:
        """Stop mid-epoch: wake every thread, drop what is queued."""
        self._stop.set()
        self.pool.close()
        while True:
            try:
                inbox.get_nowait()
            except queue.Empty:
                break
        for _ in self.targets:
            try:
                inbox.put_nowait(END_OF_EPOCH)
            except queue.Full:
                break

    def _join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=60)
        self._threads = []

    def close(self) -> None:
        self._stop.set()
        self.pool.close()
        self._join()
