"""Following the status stream from a seq cursor: complete lines only, across growth,
truncation, replacement and a new run id in the same file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dflash_train import protocol
from dflash_train.stream.reader import (
    ENVELOPE_PREFIX,
    HEAD_BYTES,
    MAX_LINE,
    decoded,
    first_envelope,
    offset_after_seq,
    read_envelope,
)

_CHUNK = 1 << 20


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
            self._skipping, self._partial = (partial[:HEAD_BYTES], len(partial)), b""
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
            notice = self._notice(line[:HEAD_BYTES], len(line))
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
