"""Reading the status stream from a seq cursor: complete lines only, across growth,
truncation, replacement and a new run id in the same file.

Lines are handled as raw bytes (without their newline inside this module); only the
envelope (seq, run, kind) is read, with a regex over the prefix the status writer
produces, so reading a long stream stays cheap.
"""

from __future__ import annotations

import json
import os
import re
import select
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from dflash_train import protocol

# protocol.encode_line writes the envelope first, in this order, without spaces.
ENVELOPE_PREFIX = re.compile(
    rb'\{"v":\d+,"seq":(?P<seq>\d+),"t":(?P<t>[^,]*),"run":"(?P<run>(?:[^"\\]|\\.)*)",'
    rb'"kind":"(?P<kind>[A-Za-z_]+)"'
)
_CHUNK = 1 << 20
# A line longer than this is never sent (protocol.MAX_LINE_BYTES): `tail` sends a small
# notice in its place, and never holds more than about this much of one line in memory.
MAX_LINE = protocol.MAX_LINE_BYTES
_HEAD = 512  # enough of a skipped line to read its envelope


class Envelope(NamedTuple):
    seq: int
    run: str
    kind: str


# Raw run ids and kinds seen so far, decoded: a stream repeats a handful of them.
_DECODED: dict[bytes, str] = {}


def decoded(raw: bytes) -> str:
    """A JSON string's raw body (run id, kind) as text."""
    text = _DECODED.get(raw)
    if text is None:
        text = json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode("utf-8", "replace")
        if len(_DECODED) < 1024:
            _DECODED[raw] = text
    return text


def read_envelope(line: bytes) -> Envelope | None:
    """seq, run and kind of one line; None for a line that is not a status line."""
    match = ENVELOPE_PREFIX.match(line)
    if match is not None:
        seq, run, kind = match.group("seq", "run", "kind")
        return Envelope(int(seq), decoded(run), decoded(kind))
    # Written by another encoder (spaces, other key order): pay for a full decode.
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    seq, run, kind = obj.get("seq"), obj.get("run"), obj.get("kind")
    if type(seq) is not int or not isinstance(run, str) or not isinstance(kind, str):
        return None
    return Envelope(seq, run, kind)


def line_time(line: bytes) -> float | None:
    """The `t` of one status line (the writer's clock); None when it has none."""
    match = ENVELOPE_PREFIX.match(line)
    try:
        return float(match.group("t")) if match else float(json.loads(line)["t"])
    except (ValueError, TypeError, KeyError, IndexError):
        return None


def first_envelope(path: Path) -> Envelope | None:
    """The envelope of the first status line of the file (which names the stream's run)."""
    try:
        with path.open("rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    return None
                env = read_envelope(line)
                if env is not None:
                    return env
    except FileNotFoundError:
        return None
    return None


def _next_line_start(fh: BinaryIO, pos: int) -> int:
    """Offset of the first line starting at or after `pos`."""
    if pos == 0:
        return 0
    fh.seek(pos - 1)
    fh.readline()
    return fh.tell()


def offset_after_seq(path: Path, seq: int, *, linear_below: int = 1 << 16) -> int:
    """A byte offset at or before the first line whose seq exceeds `seq` (binary search on
    line starts: seq rises through one stream), so resuming near the end of a huge stream
    does not read it all. Returns 0 when unsure."""
    if seq < 0:
        return 0
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        lo, hi = 0, size
        # Invariant: every line starting before `lo` has seq <= `seq`.
        while hi - lo > linear_below:
            mid = _next_line_start(fh, (lo + hi) // 2)
            if mid >= hi:
                break
            fh.seek(mid)
            line = fh.readline()
            env = read_envelope(line) if line.endswith(b"\n") else None
            if env is None:
                break
            if env.seq <= seq:
                lo = mid + len(line)
            else:
                hi = mid
        return lo


class StreamFollower:
    """Yields complete raw lines (without newline) with seq beyond the cursor. A different
    run id in the stream than the cursor's, a shrunken file or a new inode means a new
    stream: the cursor resets and reading starts from its beginning."""

    def __init__(self, path: Path, *, from_seq: int = -1, run: str | None = None) -> None:
        self.path = path
        self.cursor = from_seq
        self.run = run
        self.resets = 0
        self._fh: BinaryIO | None = None
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self._past_cursor = from_seq < 0
        # Inside a line too long to send: (its first bytes, its length so far).
        self._skipping: tuple[bytes, int] | None = None
        self.oversized = 0  # lines skipped for length
        # Notices of skipped lines met by `blocks()`, for a reader that summarises them away.
        self.notices: list[bytes] = []

    def _open(self, *, at: tuple[int, int] | None = None) -> bool:
        """Open the stream at the cursor, or at `at` = (byte offset, inode) where a saved
        history summary ends; False, with nothing opened, when there is no stream or (with
        `at`) it is another file now."""
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return False
        inode = os.fstat(fh.fileno()).st_ino
        if at is not None and at[1] != inode:
            fh.close()
            return False
        self._fh, self._inode = fh, inode
        first = first_envelope(self.path)
        if first is not None and self.run is not None and first.run != self.run:
            self._new_stream(first.run)
        if first is not None:
            self.run = first.run
        if at is not None:
            self._offset = at[0]
        else:
            self._offset = offset_after_seq(self.path, self.cursor) if first is not None else 0
        fh.seek(self._offset)
        self._partial = b""
        self._skipping = None
        return True

    def open_at(self, offset: int, inode: int) -> bool:
        """Start reading at byte `offset` of the stream with `inode` (see `_open`)."""
        return self._open(at=(offset, inode))

    @property
    def position(self) -> tuple[int, int | None]:
        """(byte offset of the next unread complete line, inode of the open stream)."""
        return self._offset, self._inode

    def _new_stream(self, run: str | None) -> None:
        self.cursor = -1
        self.run = run
        self.resets += 1
        self._past_cursor = True

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = len(self._partial) + (self._skipping[1] if self._skipping else 0)
        return st.st_ino != self._inode or st.st_size < self._offset + held

    def skip_to(self, cursor: int, run: str | None) -> None:
        """Continue live after a reader of `blocks` covered the stream up to `cursor`."""
        if cursor > self.cursor:
            self.cursor = cursor
        if run is not None:
            self.run = run
        self._past_cursor = True

    def poll(self) -> Iterator[bytes]:
        """New complete lines past the cursor, read until the current end of the file
        (a line too long to send comes as its notice)."""
        self.notices.clear()  # sent inline here
        if self._fh is None:
            if not self._open():
                return
        elif self._replaced():
            # The old file may have grown before it was rotated away (a run's last lines,
            # then a new run's first): finish it, then start on the new one.
            yield from self._accepted(self._blocks())
            self._close()
            self._new_stream(None)
            if not self._open():
                return
        yield from self._accepted(self._blocks())

    def _accepted(self, blocks: Iterator[bytes]) -> Iterator[bytes]:
        for block in blocks:
            for line in block.split(b"\n"):
                if self._accept(line):
                    yield line

    def blocks(self) -> Iterator[bytes]:
        """The rest of the stream as blocks of complete lines (newline-separated, none at
        the end), for a reader that scans many lines at once and moves the cursor itself
        (`skip_to`)."""
        if self._fh is None and not self._open():
            return
        yield from self._blocks()

    def _blocks(self) -> Iterator[bytes]:
        assert self._fh is not None
        while True:
            chunk = self._fh.read(_CHUNK)
            if not chunk:
                return
            if self._skipping is not None:
                head, size = self._skipping
                end = chunk.find(b"\n")
                if end < 0:
                    self._skipping = (head, size + len(chunk))
                    continue
                self._skipping = None
                self._offset += size + end + 1
                chunk = chunk[end + 1 :]
                notice = self._notice(head, size + end)
                if notice is not None:
                    yield notice
            data = self._partial + chunk
            end = data.rfind(b"\n")
            if end < 0:
                self._hold(data)
                continue
            self._hold(data[end + 1 :])
            self._offset += end + 1
            yield self._bounded(data[:end])

    def _hold(self, partial: bytes) -> None:
        """Keep the unfinished last line, unless it is already too long to send: then only
        its head is kept and the rest of it is counted, not read into memory."""
        if len(partial) > MAX_LINE:
            self._skipping, self._partial = (partial[:_HEAD], len(partial)), b""
        else:
            self._partial = partial

    def _bounded(self, block: bytes) -> bytes:
        """`block` with every line over MAX_LINE replaced by its notice. The check jumps
        about MAX_LINE bytes at a time, so a block of ordinary lines costs almost nothing."""
        pos = 0
        while len(block) - pos > MAX_LINE:
            newline = block.rfind(b"\n", pos, pos + MAX_LINE + 1)
            if newline < 0:
                break  # the line starting at `pos` is too long
            pos = newline + 1
        else:
            return block
        kept = []
        for line in block.split(b"\n"):
            if len(line) <= MAX_LINE:
                kept.append(line)
                continue
            notice = self._notice(line[:_HEAD], len(line))
            if notice is not None:
                kept.append(notice)
        return b"\n".join(kept)

    def _notice(self, head: bytes, size: int) -> bytes | None:
        """The notice sent instead of a skipped line; None for one the reader already had
        (its seq is at or below the cursor)."""
        match = ENVELOPE_PREFIX.match(head)
        seq = kind = run = None
        if match is not None:
            seq, run, kind = match.group("seq", "run", "kind")
            seq, run, kind = int(seq), decoded(run), decoded(kind)
            if seq <= self.cursor and self.run in (None, run):
                return None
        self.oversized += 1
        notice = protocol.skipped_notice(size, seq, kind, run)
        self.notices.append(notice)
        return notice

    def _accept(self, line: bytes) -> bool:
        env = read_envelope(line)
        if env is None:
            # Not a status line: pass it on so the reader counts it, unless it lies before
            # the cursor (a resuming reader has counted it already).
            return self._past_cursor
        if self.run is not None and env.run != self.run:
            self._new_stream(env.run)
        self.run = env.run
        if env.seq <= self.cursor:
            return False
        self.cursor = env.seq
        self._past_cursor = True
        return True

    def close(self) -> None:
        self._close()


def output_closed(fd: int) -> bool:
    """True once the reader of our stdout has gone (POLLERR on a pipe, POLLHUP on a
    socket): over SSH a follow must not outlive its channel, even when idle."""
    poller = select.poll()
    poller.register(fd, 0)  # error and hang-up are always reported
    gone = select.POLLERR | select.POLLHUP | select.POLLNVAL
    return any(events & gone for _, events in poller.poll(0))


def tail_stream(
    path: Path,
    out: BinaryIO,
    *,
    from_seq: int = -1,
    run: str | None = None,
    follow: bool = False,
    history_points: int | None = None,
    poll_s: float = 0.5,
) -> None:
    """Write the stream's lines past `from_seq` to `out`, first as a summary when
    `history_points` is given; with `follow`, keep writing new lines until `out` closes
    (BrokenPipeError propagates to the caller)."""
    follower = StreamFollower(path, from_seq=from_seq, run=run)
    try:
        if history_points is not None:
            _write_history(path, out, follower, history_points, whole=from_seq < 0 and not run)
        else:
            _write(out, follower.poll())
        out.flush()
        while follow:
            if _write(out, follower.poll()):
                out.flush()
                continue
            if output_closed(out.fileno()):
                return
            time.sleep(poll_s)
    finally:
        follower.close()


def _write_history(
    path: Path, out: BinaryIO, follower: StreamFollower, points: int, *, whole: bool
) -> None:
    """The summary of everything past the follower's cursor, then the history_end marker.
    For a whole-stream summary a saved one is continued when it still fits the stream, and
    saved again when it grew, so the next attach reads only what comes after."""
    from dflash_train.control import history_cache
    from dflash_train.control.history import HistorySummary, end_marker

    fast = history_cache.load_lines(path, points) if whole else None
    # The status writer keeps the summary's lines beside the stream: send them, then what
    # was written since, whole (so the first attach to a days-old run reads no more).
    if (
        fast is not None
        and _stream_size(path) - fast.offset <= history_cache.RAW_TAIL_BYTES
        and follower.open_at(fast.offset, fast.inode)
    ):
        follower.skip_to(fast.last_seq, fast.run)
        out.write(fast.body)
        after = list(follower.poll())
        sent = _write(out, iter(after))
        last_t = next(filter(None, map(line_time, reversed(after))), fast.last_t)
        _write(out, iter([end_marker(fast.run, follower.cursor, fast.lines_in + sent, last_t)]))
        out.flush()
        return
    saved = history_cache.load(path, points) if whole else None
    if saved is not None and follower.open_at(saved.offset, saved.inode):
        summary, start = saved.summary, saved.offset
    else:
        summary, start = HistorySummary(points), 0
    for block in follower.blocks():
        summary.add_block(block, max(follower.cursor, summary.last_seq))
    follower.skip_to(summary.last_seq, summary.run)
    marker = summary.end_marker()
    # The summary keeps only status lines: the notices of lines too long to send go first.
    notices, follower.notices = follower.notices, []
    _write(out, iter([*notices, *summary.lines(), *([marker] if marker else [])]))
    out.flush()
    offset, inode = follower.position
    if whole and inode is not None and offset - start >= history_cache.SAVE_AFTER_BYTES:
        history_cache.save(path, summary, offset, inode)


def _stream_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _write(out: BinaryIO, lines: Iterator[bytes]) -> int:
    """Write in large batches; returns how many lines were written."""
    batch: list[bytes] = []
    size = written = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        written += 1
        if size >= _CHUNK:
            out.write(b"\n".join(batch) + b"\n")
            batch.clear()
            size = 0
    if batch:
        out.write(b"\n".join(batch) + b"\n")
    return written
