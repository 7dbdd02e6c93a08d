"""The stop request a run acts on between steps: set from signal handlers, the monitor
(a fatal problem) or another rank; read by the loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The reason a run stops when its run dir was deleted under it: it writes nothing more.
ORPHANED = "orphaned"


class StopDuringWarmUp(BaseException):
    """Raised by the signal handler while the run compiles before its first step, so a stop
    ends that warm-up (minutes on a GPU) at once instead of after it: no step has run, so
    there is nothing to checkpoint. A BaseException, as KeyboardInterrupt is, so that the
    warm-up's own `except Exception` fallbacks (and inductor's) do not take it for a failed
    compile."""


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self.message = ""
        # Main thread only (signal handlers run there): inside interruptible(), and inside
        # an uninterruptible() stretch of it.
        self._warm_up = False
        self._shielded = False

    def _stop_now(self) -> None:
        self._warm_up = False  # one raise; a second signal while it unwinds only asks
        raise StopDuringWarmUp(self.message)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A stretch before the first step that a stop signal ends at once (on_signal
        raises StopDuringWarmUp in it); a signal's stop asked for before it is raised on
        entry."""
        if self.reason == "signal":
            self._stop_now()
        self._warm_up = True
        try:
            yield
        finally:
            self._warm_up = False

    @contextmanager
    def uninterruptible(self) -> Iterator[None]:
        """Inside interruptible(): a stream write, which must land whole with its seq
        counted; a signal's stop that came meanwhile is raised after it."""
        shielded, self._shielded = self._shielded, True
        try:
            yield
        finally:
            self._shielded = shielded
        if self._warm_up and not shielded and self.reason == "signal":
            self._stop_now()

    @property
    def in_warm_up(self) -> bool:
        """Whether a stop signal now would end the run at once."""
        return self._warm_up and not self._shielded

    def on_signal(self, name: str) -> None:
        """What a SIGTERM or SIGINT does: ask the loop to stop after its step, or, inside
        interruptible(), stop now (only for a signal's stop: an earlier request, say the
        monitor's error, keeps its own reason and course)."""
        self.request("signal", name)
        if self.in_warm_up and self.reason == "signal":
            self._stop_now()

    def request(self, reason: str, message: str = "") -> None:
        if not self._event.is_set():
            self.reason, self.message = reason, message
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()
