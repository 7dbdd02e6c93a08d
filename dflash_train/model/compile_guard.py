"""One lock for running nn.Modules, so a torch.compile never traces beside another thread.

While dynamo/AOTAutograd trace a graph, FX patches nn.Module.__call__ and sets its
"tracing" flag for the whole process; a module called meanwhile from another thread goes
through the tracer. Seen twice on an H200: the target worker died with "Detected that you
are using FX to symbolically trace a dynamo-optimized function" while the drafter thread
compiled (a first guard that made only predicted first-time shapes exclusive still lost:
dynamo also recompiles where nobody predicted it). So every stretch of host code that runs
modules, and may therefore compile, holds this lock: the drafter step and each target
forward. Their GPU work still overlaps (it is queued asynchronously on separate streams);
only the launching is serialised, and a host sync inside a held stretch (the loss's count
of rows that carry loss) lets go of the lock while it waits (`paused`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ModuleLock:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._local = threading.local()

    @property
    def depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Run modules (and compile) alone; re-entrant."""
        self._lock.acquire()
        self._local.depth = self.depth + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            self._lock.release()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Inside `held`: let other threads run modules while this one waits on the device
        (it runs none meanwhile). Outside `held`: nothing."""
        depth = self.depth
        for _ in range(depth):
            self._lock.release()
        self._local.depth = 0
        try:
            yield
        finally:
            for _ in range(depth):
                self._lock.acquire()
            self._local.depth = depth


GUARD = ModuleLock()
