"""HiddenStatePool: the bounded hand-over between target workers and the drafter. The
drafter draws a random ready batch once enough are ready, which mixes length buckets."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class PoolClosed(RuntimeError):
    pass


@dataclass(frozen=True)
class PoolStats:
    """Counters since the pool was made; the monitor differences two snapshots."""

    ready: int
    depth: int
    min_ready: int
    producer_wait_s: float
    consumer_wait_s: float
    puts: int
    takes: int
    starved_takes: int
    bucket_mix: dict[str, int]


class HiddenStatePool(Generic[T]):
    """At most `depth` items; `take` waits until `min_ready` are ready (or the epoch's
    producers are done, then it hands out what is left) and returns one at random."""

    def __init__(self, depth: int, min_ready: int, *, seed: int = 0) -> None:
        if not 1 <= min_ready <= depth:
            raise ValueError(f"hs_min_ready must be in 1..hs_queue_depth, got {min_ready}/{depth}")
        self._items: list[tuple[T, str]] = []
        self._depth = depth
        self._min_ready = min_ready
        self._seed = seed
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._draining = False
        self._closed = False
        self._error: BaseException | None = None
        self._producer_wait = 0.0
        self._consumer_wait = 0.0
        self._puts = 0
        self._takes = 0
        self._starved_takes = 0

    # -- producers -------------------------------------------------------------------
    def put(self, item: T, bucket: str = "") -> None:
        """Blocks while the pool is full. Raises PoolClosed once closed."""
        with self._cond:
            start = time.perf_counter()
            while not self._closed and len(self._items) >= self._depth:
                self._cond.wait(0.5)
            self._producer_wait += time.perf_counter() - start
            if self._closed:
                raise PoolClosed("pool closed")
            self._items.append((item, bucket))
            self._puts += 1
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """A producer died: the consumer's next take re-raises its error."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # -- epoch boundaries ------------------------------------------------------------
    def start_epoch(self, epoch: int) -> None:
        with self._cond:
            self._draining = False
            self._rng.seed(self._seed * 1_000_003 + epoch)

    def finish_epoch(self) -> None:
        """Producers are done with this epoch: hand out what is left regardless of min_ready."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    # -- the consumer ----------------------------------------------------------------
    def take(self, should_stop: Callable[[], bool] = lambda: False) -> T | None:
        """A random ready item; None when the epoch is drained, the pool closed, or
        `should_stop()` turned true while waiting."""
        with self._cond:
            start = time.perf_counter()
            try:
                while True:
                    if self._error is not None:
                        raise RuntimeError("a hidden-state producer failed") from self._error
                    if self._closed or should_stop():
                        return None
                    if self._items and (self._draining or len(self._items) >= self._min_ready):
                        break
                    if self._draining and not self._items:
                        return None
                    self._cond.wait(0.1)
            finally:
                waited = time.perf_counter() - start
                self._consumer_wait += waited
                # A take that had to wait means the drafter sat idle: it was starved.
                if waited > 1e-3:
                    self._starved_takes += 1
            index = self._rng.randrange(len(self._items))
            # Swap-remove keeps take O(1); order inside the pool carries no meaning.
            self._items[index], self._items[-1] = self._items[-1], self._items[index]
            item, _ = self._items.pop()
            self._takes += 1
            self._cond.notify_all()
            return item

    # -- control ---------------------------------------------------------------------
    @property
    def limits(self) -> dict[str, int]:
        with self._cond:
            return {"hs_queue_depth": self._depth, "hs_min_ready": self._min_ready}

    def set_limits(self, *, depth: int | None = None, min_ready: int | None = None) -> None:
        with self._cond:
            new_depth = self._depth if depth is None else depth
            new_min = self._min_ready if min_ready is None else min_ready
            if not 1 <= new_min <= new_depth:
                raise ValueError(
                    f"hs_min_ready must be in 1..hs_queue_depth, got {new_min}/{new_depth}"
                )
            # A smaller depth never drops ready items: producers just wait until the
            # consumer has taken the pool below the new bound.
            self._depth, self._min_ready = new_depth, new_min
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()

    def stats(self) -> PoolStats:
        with self._cond:
            mix = Counter(bucket for _, bucket in self._items)
            return PoolStats(
                ready=len(self._items),
                depth=self._depth,
                min_ready=self._min_ready,
                producer_wait_s=self._producer_wait,
                consumer_wait_s=self._consumer_wait,
                puts=self._puts,
                takes=self._takes,
                starved_takes=self._starved_takes,
                bucket_mix=dict(mix),
            )
