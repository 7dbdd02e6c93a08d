"""The stop request a run acts on between steps: set from signal handlers, the monitor
(a fatal problem) or another rank; read by the loop."""

from __future__ import annotations

import threading

# The reason a run stops when its run dir was deleted under it: it writes nothing more.
ORPHANED = "orphaned"


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self.message = ""

    def request(self, reason: str, message: str = "") -> None:
        if not self._event.is_set():
            self.reason, self.message = reason, message
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()
