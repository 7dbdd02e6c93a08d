"""The `tail --history` summary saved beside the stream, so the next attach to a days-old
run summarises only what was written since, instead of reading the whole stream again
(1.3 s of CPU for 79 MB: most of a console's first frame).

The file is a convenience: it is used only when it provably continues this very stream
(same inode, the stream no shorter than the saved offset, and the bytes just before that
offset unchanged), and any problem reading or writing it means "summarise from scratch"."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dflash_train.rundir import atomic_write_text
from dflash_train.stream.summary import HistorySummary

VERSION = 2  # 2: per-GPU power extremes, 1,000 checkpoint lines kept
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
        # Never mkdir: the run dir may have been deleted since the stream was opened
        # above (serialising the summary takes a while), and must stay deleted.
        atomic_write_text(cache_path(stream, summary.points), json.dumps(record), make_parent=False)
    except OSError:
        return False
    return True


def lines_path(stream: Path, points: int) -> Path:
    return stream.with_name(f".{stream.name}.history-{points}.lines")


@dataclass(frozen=True)
class SavedLines:
    """The summary's lines as `tail --history` sends them, written by the status writer
    beside its state: an attach sends them as they are, then the stream after `offset`."""

    body: bytes  # the summary lines, each ending in a newline
    offset: int
    inode: int
    run: str
    last_seq: int
    lines_in: int
    last_t: float | None  # the box-clock time of the newest line the body covers


def save_lines(stream: Path, summary: HistorySummary, offset: int, inode: int) -> bool:
    if summary.run is None or summary.last_seq < 0:
        return False
    try:
        with stream.open("rb") as fh:
            if os.fstat(fh.fileno()).st_ino != inode:
                return False
            check = _check(fh, offset)
        header = {
            "v": VERSION, "points": summary.points, "inode": inode, "offset": offset,
            "check": check, "run": summary.run, "last_seq": summary.last_seq,
            "lines_in": summary.lines_in, "last_t": summary.last_t,
        }  # fmt: skip
        body = b"".join(line + b"\n" for line in summary.lines())
        _atomic_write_bytes(
            lines_path(stream, summary.points), json.dumps(header).encode() + b"\n" + body
        )
    except OSError:
        return False
    return True


def load_lines(stream: Path, points: int) -> SavedLines | None:
    """The saved lines when they still begin this very stream; else None."""
    try:
        with lines_path(stream, points).open("rb") as saved:
            header = json.loads(saved.readline())
            body = saved.read()
        with stream.open("rb") as fh:
            st = os.fstat(fh.fileno())
            if (
                header["v"] != VERSION
                or header["points"] != points
                or header["inode"] != st.st_ino
                or not 0 < header["offset"] <= st.st_size
                or _check(fh, header["offset"]) != header["check"]
            ):
                return None
        last_t = header.get("last_t")  # absent from files saved before it was kept
        return SavedLines(
            body, int(header["offset"]), st.st_ino, str(header["run"]),
            int(header["last_seq"]), int(header["lines_in"]),
            float(last_t) if isinstance(last_t, (int, float)) else None,
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# What the console asks for (Session's history_points): the summary the writer keeps.
KEPT_POINTS = 400
# The writer summarises its lines in blocks of this size, and saves at most this often
# (a save serialises about 1 MB): a first attach reads at most that much stream itself.
KEEPER_BLOCK_BYTES = 64 * 1024
KEEPER_SAVE_EVERY_S = 10.0
# An attach sends the saved lines and then, whole, the stream written since, when that is
# at most this much (about 3,000 lines); beyond it, it summarises the rest first.
RAW_TAIL_BYTES = 1 << 20


class SummaryKeeper:
    """Keeps `stream`'s saved summary current as its one writer appends `add(line)`: lines
    are summarised a block at a time and the summary saved when SAVE_AFTER_BYTES more are
    covered and KEEPER_SAVE_EVERY_S passed (and at `close`). Starts from the saved summary
    when it fits the stream, else from one pass over what the stream holds (a resumed run).
    Any failure turns it off: the stream matters, the summary is a convenience."""

    def __init__(
        self,
        stream: Path,
        points: int = KEPT_POINTS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.points = points
        self.clock = clock
        self.enabled = True
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.summary, self.offset, self.inode = self._catch_up()
        self._saved_offset = self.offset
        self._saved_at = clock()

    def _catch_up(self) -> tuple[HistorySummary, int, int | None]:
        try:
            with self.stream.open("rb") as fh:
                inode = os.fstat(fh.fileno()).st_ino
                saved = load(self.stream, self.points)
                summary, offset = (
                    (saved.summary, saved.offset) if saved else (HistorySummary(self.points), 0)
                )
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return HistorySummary(self.points), 0, None
        end = data.rfind(b"\n") + 1  # a torn last line is the writer's to finish
        if end:
            summary.add_block(data[: end - 1], summary.last_seq)
        return summary, offset + end, inode

    def add(self, line: bytes) -> None:
        """One line just appended (with its newline)."""
        if not self.enabled:
            return
        self._pending.append(line.rstrip(b"\n"))
        self._pending_bytes += len(line)
        if self._pending_bytes >= KEEPER_BLOCK_BYTES:
            self._summarise()
            if (
                self.offset - self._saved_offset >= SAVE_AFTER_BYTES
                and self.clock() - self._saved_at >= KEEPER_SAVE_EVERY_S
            ):
                self.save()

    def _summarise(self) -> None:
        if not self._pending:
            return
        try:
            self.summary.add_block(b"\n".join(self._pending), self.summary.last_seq)
        except Exception:  # a bug here must never cost the run its stream
            self.enabled = False
        self.offset += self._pending_bytes
        self._pending, self._pending_bytes = [], 0

    def save(self) -> bool:
        if not self.enabled:
            return False
        self._summarise()
        if self.inode is None:
            with contextlib.suppress(OSError):
                self.inode = os.stat(self.stream).st_ino
        if self.inode is None or self.offset <= 0:
            return False
        self._saved_at = self.clock()
        if save(self.stream, self.summary, self.offset, self.inode):
            self._saved_offset = self.offset
            # The lines as an attach sends them too: it need not rebuild the summary.
            save_lines(self.stream, self.summary, self.offset, self.inode)
            return True
        return False

    def close(self) -> None:
        if self.offset + self._pending_bytes > self._saved_offset:
            self.save()
