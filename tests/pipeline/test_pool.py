"""HiddenStatePool: bounded, random draw after min_ready, drains at epoch end, live limits."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from dflash_train.pipeline.pool import HiddenStatePool, PoolClosed


def _take_within(pool: HiddenStatePool[int], seconds: float) -> int | None:
    """take() that gives up after `seconds` (through its should_stop hook)."""
    deadline = time.monotonic() + seconds
    return pool.take(should_stop=lambda: time.monotonic() > deadline)


def _wait_until_blocked(thread: threading.Thread, method: str) -> None:
    """Until `thread` waits on the pool's condition inside `method` (its stack says so): a
    loaded machine may start or run it late, and an order by sleeps would not hold."""
    deadline = time.monotonic() + 30
    while True:
        frame = sys._current_frames().get(thread.ident or -1)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if "wait" in names and method in names:
            return
        assert time.monotonic() < deadline, f"{thread.name} never blocked in {method}: {names}"
        time.sleep(0.005)


def test_take_waits_for_min_ready_then_draws_at_random() -> None:
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=4, seed=1)
    for i in range(3):
        pool.put(i, bucket="a")
    assert _take_within(pool, 0.3) is None  # three ready, four needed
    pool.put(3, bucket="b")
    drawn = [_take_within(pool, 1.0)]
    assert pool.stats().ready == 3
    # With four ready, fill up again so every draw sees >= min_ready.
    for i in range(4, 40):
        pool.put(i)
        drawn.append(pool.take())
    assert sorted(drawn) == sorted(set(drawn))
    assert drawn != sorted(drawn), "draws must not come out in arrival order"


def test_put_blocks_when_full_and_counts_producer_wait() -> None:
    pool: HiddenStatePool[int] = HiddenStatePool(depth=2, min_ready=1)
    pool.put(0)
    pool.put(1)
    done = threading.Event()

    def producer() -> None:
        pool.put(2)
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    _wait_until_blocked(thread, "put")  # the wait is timed from here
    time.sleep(0.2)
    assert not done.is_set() and pool.stats().ready == 2
    assert pool.take() is not None
    thread.join(2)
    assert done.is_set()
    stats = pool.stats()
    assert stats.ready == 2 and stats.producer_wait_s >= 0.15


def test_finish_epoch_drains_below_min_ready_then_ends() -> None:
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=8)
    pool.start_epoch(0)
    for i in range(3):
        pool.put(i, bucket=str(i % 2))
    assert pool.stats().bucket_mix == {"0": 2, "1": 1}
    pool.finish_epoch()
    assert sorted([pool.take(), pool.take(), pool.take()]) == [0, 1, 2]  # type: ignore[type-var]
    assert pool.take() is None
    pool.start_epoch(1)
    pool.put(5)
    assert _take_within(pool, 0.3) is None  # a new epoch: min_ready applies again


def test_set_limits_live_and_rejects_min_above_depth() -> None:
    pool: HiddenStatePool[int] = HiddenStatePool(depth=4, min_ready=4)
    pool.put(1)
    pool.put(2)
    got: list[int | None] = []
    consumer = threading.Thread(target=lambda: got.append(pool.take()))
    consumer.start()
    time.sleep(0.2)
    assert not got
    pool.set_limits(min_ready=2)  # the waiting consumer wakes up under the new rule
    consumer.join(2)
    assert got and got[0] in (1, 2)
    with pytest.raises(ValueError, match="hs_min_ready"):
        pool.set_limits(depth=1, min_ready=2)
    assert pool.limits == {"hs_queue_depth": 4, "hs_min_ready": 2}


def test_close_unblocks_producers_and_failure_reaches_consumer() -> None:
    pool: HiddenStatePool[int] = HiddenStatePool(depth=1, min_ready=1)
    pool.put(0)
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            pool.put(1)
        except PoolClosed as exc:
            errors.append(exc)

    thread = threading.Thread(target=producer)
    thread.start()
    time.sleep(0.1)
    pool.close()
    thread.join(2)
    assert errors and pool.take() is None

    failing: HiddenStatePool[int] = HiddenStatePool(depth=2, min_ready=2)
    failing.fail(ValueError("target forward broke"))
    with pytest.raises(RuntimeError, match="producer failed") as info:
        failing.take()
    assert isinstance(info.value.__cause__, ValueError)


def test_starved_takes_are_counted() -> None:
    pool: HiddenStatePool[int] = HiddenStatePool(depth=2, min_ready=1)
    taken: list[int | None] = []
    consumer = threading.Thread(target=lambda: taken.append(pool.take()))
    consumer.start()
    _wait_until_blocked(consumer, "take")  # it waits on an empty pool: starved
    time.sleep(0.05)  # well past the 1 ms that counts a take as starved
    pool.put(7)
    consumer.join(10)
    assert taken == [7]
    pool.put(8)
    assert pool.take() == 8
    stats = pool.stats()
    assert (stats.takes, stats.starved_takes) == (2, 1)
