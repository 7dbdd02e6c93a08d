"""Appends protocol lines to status.jsonl. One instance per trainer; thread-safe so the
monitor thread (the designated writer) and the main thread's start/end lines cannot
interleave half lines. Stdlib only."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from dflash_train import protocol

if TYPE_CHECKING:
    from dflash_train.control.tail import Envelope


_BLOCK = 1 << 20
# An envelope is the first ~150 bytes of a line; enough to read one however long the line.
_HEAD = 512


def _line_starts_backwards(fh: BinaryIO, end: int, floor: int) -> Iterator[int]:
    """Offsets at which lines start, the last line's first, found by reading blocks
    backwards from `end` down to `floor` (where a line starts only when floor is 0)."""
    pos = end
    while pos > floor:
        start = max(floor, pos - _BLOCK)
        fh.seek(start)
        block = fh.read(pos - start)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            yield start + i + 1
        pos = start
    if floor == 0:
        yield 0


def last_record(path: Path, *, max_scan_bytes: int = 64 << 20) -> Envelope | None:
    """seq, run and kind of the stream's last status line, reading backwards from the end.
    A line too long for readers (over MAX_LINE_BYTES: `tail` sends a notice instead) still
    used up its seq, so its envelope counts: a resumed writer that missed it would start
    its run's seq again at 0 and every reader would drop what followed as already seen."""
    from dflash_train.control.tail import read_envelope

    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return None
    with fh:
        end = fh.seek(0, os.SEEK_END)
        line_end = end  # where the line starting at the next offset ends
        for line_start in _line_starts_backwards(fh, end, max(0, end - max_scan_bytes)):
            length = line_end - line_start
            line_end = line_start - 1  # the newline before this line ends the one before
            if length <= 0:
                continue
            fh.seek(line_start)
            # A short line decodes whole; of a long one, the envelope at its head is enough.
            line = fh.read(length if length <= _HEAD * 8 else _HEAD)
            env = read_envelope(line.rstrip(b"\n"))
            if env is not None:
                return env
    return None


class StatusWriter:
    """Writes lines for run `run_id`. When the stream already holds lines of the same run
    (a resumed run), seq continues after the last one so readers' cursors stay valid.
    With `summary_points`, it also keeps the stream's history summary current beside it
    (control/history_cache.SummaryKeeper), so a console's first attach is as quick as
    any later one."""

    def __init__(self, path: Path, run_id: str, *, summary_points: int | None = None) -> None:
        self.path = path
        self.run_id = run_id
        self._lock = threading.Lock()
        last = last_record(path)
        self._seq = last.seq + 1 if last is not None and last.run == run_id else 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if last is not None and last.run != run_id and path.exists():
            # A new run in the same directory: keep the old stream beside it, start afresh,
            # so readers see a shrunken file with a new run id.
            path.rename(path.with_name(f"status.{last.run}.jsonl"))
        self._fh = path.open("ab", buffering=0)
        self.last_write = 0.0
        self._keeper = None
        if summary_points is not None:
            from dflash_train.control.history_cache import SummaryKeeper

            self._keeper = SummaryKeeper(path, summary_points)

    @property
    def next_seq(self) -> int:
        return self._seq

    def write(self, kind: str, **fields: Any) -> int:
        with self._lock:
            line = protocol.encode_line(kind, seq=self._seq, run=self.run_id, **fields)
            # One write() of the whole line: O_APPEND makes it land whole.
            data = line.encode("utf-8")
            self._fh.write(data)
            self.last_write = time.monotonic()
            if self._keeper is not None:
                self._keeper.add(data)
            self._seq += 1
            return self._seq - 1

    def close(self) -> None:
        with self._lock:
            self._fh.close()
            if self._keeper is not None:
                self._keeper.close()
