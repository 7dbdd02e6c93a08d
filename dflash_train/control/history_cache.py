"""The `tail --history` summary saved beside the stream, so the next attach to a days-old
run summarises only what was written since, instead of reading the whole stream again
(1.3 s of CPU for 79 MB: most of a console's first frame).

The file is a convenience: it is used only when it provably continues this very stream
(same inode, the stream no shorter than the saved offset, and the bytes just before that
offset unchanged), and any problem reading or writing it means "summarise from scratch"."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dflash_train.control.history import HistorySummary
from dflash_train.rundir import atomic_write_text

VERSION = 1
# Saved again only when at least this much more of the stream was summarised: an attach to
# an idle run writes nothing.
SAVE_AFTER_BYTES = 256 * 1024
_CHECKED_BYTES = 4096


def cache_path(stream: Path, points: int) -> Path:
    return stream.with_name(f".{stream.name}.history-{points}.json")


def _check(fh: BinaryIO, offset: int) -> str:
    start = max(0, offset - _CHECKED_BYTES)
    fh.seek(start)
    return hashlib.sha256(fh.read(offset - start)).hexdigest()


@dataclass(frozen=True)
class Saved:
    summary: HistorySummary
    offset: int  # the summary covers the stream's bytes before this
    inode: int  # of the stream it covers


def load(stream: Path, points: int) -> Saved | None:
    """The saved summary when it continues `stream` as it is now; else None."""
    try:
        saved = json.loads(cache_path(stream, points).read_text())
        with stream.open("rb") as fh:
            st = os.fstat(fh.fileno())
            if (
                saved["v"] != VERSION
                or saved["points"] != points
                or saved["inode"] != st.st_ino
                or not 0 < saved["offset"] <= st.st_size
                or _check(fh, saved["offset"]) != saved["check"]
            ):
                return None
        return Saved(HistorySummary.from_state(saved["summary"]), saved["offset"], st.st_ino)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def save(stream: Path, summary: HistorySummary, offset: int, inode: int) -> bool:
    """Save the summary as covering the first `offset` bytes of the stream with `inode`;
    False when that is no longer the stream or the run dir cannot be written (a read-only
    mount, another user's run): nothing depends on it."""
    try:
        with stream.open("rb") as fh:
            if os.fstat(fh.fileno()).st_ino != inode:
                return False
            check = _check(fh, offset)
        record = {
            "v": VERSION,
            "points": summary.points,
            "inode": inode,
            "offset": offset,
            "check": check,
            "summary": summary.state(),
        }
        atomic_write_text(cache_path(stream, summary.points), json.dumps(record))
    except OSError:
        return False
    return True
