"""One line appended by the control plane to a stream no trainer writes: a stopped run's
event (an evaluation by hand), a failed restart's word, the run_end of a trainer `stop` had
to kill. The stream has one writer while a trainer lives (its seq numbers are the readers'
cursors), so the line is written under the run lock, with seq continuing after the last
line; while a trainer holds the lock, RunLock raises LockHeld and the caller decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dflash_train.protocol import StatusLine
from dflash_train.rundir import RunDir, RunLock
from dflash_train.stream.reader import last_record
from dflash_train.stream.writer import StatusWriter


def append_line(
    run_dir: RunDir,
    kind: str,
    fields: dict[str, Any],
    *,
    onto: Callable[[StatusLine], bool] | None = None,
) -> bool:
    """Append `kind` with `fields` to the run's stream under its lock (LockHeld while a
    trainer holds it). False, writing nothing, when the stream has no line, or when
    `onto(last line)` says the stream is not the one meant (another run, already ended)."""
    with RunLock(run_dir.lock):
        last = last_record(run_dir.status)
        if last is None or (onto is not None and not onto(last)):
            return False
        writer = StatusWriter(run_dir.status, last.run)
        try:
            writer.write(kind, **fields)
        finally:
            writer.close()
        return True
