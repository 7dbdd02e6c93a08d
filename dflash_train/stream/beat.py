"""Lines that say a process is alive while it has nothing else to write: the GPUs' load as
`gpu` lines, and a heartbeat when nothing was written for a beat. `status` and the console
call a run stalled when its stream goes quiet, so a process busy for minutes without
progress to report writes these meanwhile: a prepare between progress lines (a CPU batch
takes minutes), and the trainer compiling before its first step (its monitor thread starts
with the training loop; on the H200 a Qwen3-8B target's layers compiled for 108 s and the
drafter's attention 39 s more, and the stream said nothing after run_start).

The thread only samples NVML and writes lines: no model code runs in it, so compiles stay on
the main thread alone (pipeline/compile_warm_up.py says why)."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_train.stream.writer import StatusWriter


class Beat:
    """Every `every` seconds until stopped: a `gpu` line for `roles` (GPU index to role;
    none when empty or NVML is missing) and a heartbeat if nothing else was written for
    that long. After `limit` seconds it falls silent: whatever it covers has hung by then,
    and should read as a stall."""

    def __init__(
        self,
        writer: StatusWriter,
        roles: dict[int, str],
        every: float,
        limit: float | None = None,
        name: str = "beat",
    ) -> None:
        self.writer = writer
        self.roles = roles
        self.every = every
        self.limit = limit
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Beat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.every + 5.0)

    def __enter__(self) -> Beat:
        return self.start()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        until = None if self.limit is None else time.monotonic() + self.limit
        gpus = bool(self.roles)
        while not self._done.wait(self.every):
            if until is not None and time.monotonic() >= until:
                return
            if gpus:
                from dflash_train.gpu_telemetry import sample_gpus

                sample = sample_gpus(self.roles, processes=False)
                gpus = bool(sample["available"])
                if gpus:
                    self.writer.write("gpu", available=True, gpus=sample["gpus"])
            if time.monotonic() - self.writer.last_write >= self.every:
                self.writer.write("heartbeat")
