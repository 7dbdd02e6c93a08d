"""`within`, the bounded await every console loop is built on: its result, its timeout,
and a cancel that is never lost, even in the loop turn where the awaited thing finishes
(asyncio.wait_for lost that one on Python 3.10 and 3.11, and a fleet poll loop ran on
after Fleet.close() cancelled it, which then waited forever)."""

from __future__ import annotations

import asyncio

import pytest

from dflash_tui.sources.deadline import within


async def test_the_result_and_the_timeout() -> None:
    assert await within(asyncio.sleep(0, result=7), 5) == 7
    slow = asyncio.ensure_future(asyncio.sleep(60))
    with pytest.raises(asyncio.TimeoutError):
        await within(slow, 0.05)
    assert slow.cancelled()  # as under wait_for: what timed out is cancelled


async def test_a_cancel_in_the_turn_the_inner_finishes_is_not_lost() -> None:
    loop = asyncio.get_running_loop()
    inner: asyncio.Future[int] = loop.create_future()
    waiting = asyncio.ensure_future(within(inner, 60))
    await asyncio.sleep(0)  # `waiting` now waits on inner
    inner.set_result(1)
    waiting.cancel()  # the same turn: the one asyncio.wait_for (3.10, 3.11) returned 1 from
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_cancel_of_the_caller_cancels_the_inner() -> None:
    inner = asyncio.ensure_future(asyncio.sleep(60))
    waiting = asyncio.ensure_future(within(inner, None))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.cancelled()
