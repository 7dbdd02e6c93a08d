"""Appends protocol lines to status.jsonl. One instance per trainer; thread-safe so the
monitor thread (the designated writer) and the main thread's start/end lines cannot
interleave half lines. Stdlib only."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.stream.reader import last_record


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
            from dflash_train.stream.summary_cache import SummaryKeeper

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
