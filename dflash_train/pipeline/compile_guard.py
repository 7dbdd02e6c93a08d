"""Keeps a torch.compile from running while another thread runs nn.Modules.

While dynamo/AOTAutograd trace a graph, FX patches nn.Module.__call__ for the whole
process; a module called meanwhile from another thread goes through the tracer (seen on an
H200: the target worker died with "using FX to symbolically trace a dynamo-optimized
function" while the drafter compiled flex attention for a new batch shape). So code that
runs modules holds the guard shared, and code that may compile holds it exclusively: the
drafter step upgrades for a new attention shape, a target worker asks for it before a batch
whose shape signature the warm-up did not cover. One upgrader (the drafter's thread) and
workers that never upgrade means no deadlock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CompileGuard:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared: dict[int, int] = {}  # thread id -> depth
        self._owner: int | None = None  # the thread holding it exclusively
        self._depth = 0
        self._waiting = 0  # exclusive requests pending: new shared holders wait for them

    def _others_shared(self, me: int) -> bool:
        return any(n for tid, n in self._shared.items() if tid != me)

    @contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            while (self._owner not in (None, me)) or (
                self._waiting and self._owner != me and not self._shared.get(me)
            ):
                self._cond.wait()
            self._shared[me] = self._shared.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._shared[me] -= 1
                if not self._shared[me]:
                    del self._shared[me]
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait until no other thread runs modules or compiles, then hold it alone. The
        caller may already hold it shared (an upgrade) or exclusively (nested)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
            else:
                self._waiting += 1
                try:
                    while self._owner is not None or self._others_shared(me):
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._owner, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._owner = None
                self._cond.notify_all()


GUARD = CompileGuard()
