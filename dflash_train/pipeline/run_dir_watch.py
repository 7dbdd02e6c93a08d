"""Whether the run directory a trainer writes to is still the one it started in. A run dir
deleted (or replaced) under a live trainer leaves it an orphan: its lock and stream are
gone, so no `stop` or `status` can find it, and a checkpoint would recreate the directory
as a stray. The monitor checks now and then and has the run stop without writing."""

from __future__ import annotations

import os
from pathlib import Path


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class RunDirWatch:
    def __init__(self, root: Path, stream: Path) -> None:
        self.root = root
        self.stream = stream
        self._root_id = _identity(root)
        self._stream_id = _identity(stream)

    def gone(self) -> str | None:
        """Why the run dir is no longer this run's, or None while it is."""
        if self._root_id is not None and _identity(self.root) != self._root_id:
            return f"run dir {self.root} was deleted or replaced"
        if self._stream_id is not None and _identity(self.stream) != self._stream_id:
            return f"status stream {self.stream} was deleted or replaced"
        return None
