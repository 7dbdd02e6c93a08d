"""`within(awaitable, seconds)`: asyncio.wait_for without its cancellation hole. On Python
3.10 and 3.11, wait_for returns the inner result when the task is cancelled in the same
loop turn as the inner awaitable finishes: the cancel is lost, and a loop built on it
(the fleet's status polls, the session's reconnect sleep) runs on, so whoever cancelled
it and awaits its end (Fleet.close, an app's exit) waits forever. asyncio.wait never
swallows the outer cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """The awaitable's result, or asyncio.TimeoutError after `seconds` (it is cancelled
    then; None: no limit). A cancel of the caller cancels it too and is always raised."""
    inner = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({inner}, timeout=seconds)
    except BaseException:
        inner.cancel()
        # Its cleanup (a child's pipes closed) runs before the cancel goes on, as under
        # wait_for: the caller may close the loop next.
        await asyncio.wait({inner})
        raise
    if not done:
        inner.cancel()
        await asyncio.wait({inner})  # its cleanup runs first, as under wait_for
        raise asyncio.TimeoutError
    return inner.result()
