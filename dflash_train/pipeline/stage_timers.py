"""Per-stage timings for `profile` lines. On CUDA a stage is bracketed by timing events
that the monitor resolves once they have completed, so timing never syncs the hot path."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STAGES = ("load", "target_fwd", "copy", "drafter_fwd_bwd", "optimizer")


class StageTimers:
    def __init__(self, max_pending: int = 512) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, list[float]] = {}
        # Bounded: when the monitor falls behind, the oldest unresolved pairs are dropped.
        self._pending: deque[tuple[str, Any, Any]] = deque(maxlen=max_pending)

    def _add(self, stage: str, ms: float) -> None:
        with self._lock:
            total = self._totals.setdefault(stage, [0.0, 0])
            total[0] += ms
            total[1] += 1

    @contextmanager
    def time(self, stage: str, device: Any = None) -> Iterator[None]:
        """Time the enclosed work on `device`'s current stream (host time for CPU/None)."""
        if device is not None and getattr(device, "type", None) == "cuda":
            import torch

            stream = torch.cuda.current_stream(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            yield
            end.record(stream)
            with self._lock:
                self._pending.append((stage, start, end))
            return
        t0 = time.perf_counter()
        yield
        self._add(stage, (time.perf_counter() - t0) * 1000.0)

    def collect(self) -> dict[str, float]:
        """Mean ms per stage since the last collect; unfinished GPU pairs wait for the next."""
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
        keep = []
        for stage, start, end in pending:
            if end.query():
                self._add(stage, start.elapsed_time(end))
            else:
                keep.append((stage, start, end))
        with self._lock:
            self._pending.extendleft(reversed(keep))
            totals, self._totals = self._totals, {}
        return {stage: round(ms / n, 3) for stage, (ms, n) in totals.items() if n}
