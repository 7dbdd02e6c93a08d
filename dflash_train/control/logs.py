"""Reading train.log the way `tail -F` does: the last N lines, then each new complete line,
across truncation (the file shrank: read it again from the start) and rotation (another
file at the path: finish the old one, then read the new one from its start). Every line is
cut to a bounded length, and a progress bar's carriage-return redraws keep only their last
state, so one runaway line cannot flood the reader."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

MAX_LINE_BYTES = 4096
_READ = 1 << 16


def visible(line: bytes, max_bytes: int = MAX_LINE_BYTES) -> bytes:
    """What a terminal would show of one line: the text after its last carriage return,
    cut to `max_bytes` with a note of how much was left out."""
    line = line.rstrip(b"\r")
    if b"\r" in line:
        line = line.rsplit(b"\r", 1)[1]
    if len(line) <= max_bytes:
        return line
    return line[:max_bytes] + f" … [{len(line) - max_bytes} more bytes cut]".encode()


def last_lines(path: Path, count: int, max_bytes: int = MAX_LINE_BYTES) -> tuple[list[bytes], int]:
    """The last `count` complete lines of the file and the offset just past them (a final
    partial line is left for the follower). Reads backwards in blocks: a long log costs
    what its tail costs."""
    with path.open("rb") as fh:
        end = os.fstat(fh.fileno()).st_size
        data = b""
        pos = end
        # Enough to hold `count` lines even when each is at its cut length.
        budget = (count + 1) * (max_bytes + 1) * 4
        while pos > 0 and data.count(b"\n") <= count and end - pos < budget:
            step = min(_READ, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    complete_end = data.rfind(b"\n")
    if complete_end < 0:
        return [], pos
    body = data[:complete_end]
    lines = body.split(b"\n")
    if pos > 0:
        lines = lines[1:]  # the first one is probably a piece of a longer line
    offset = pos + complete_end + 1
    chosen = lines[-count:] if count > 0 else []
    return [visible(line, max_bytes) for line in chosen], offset


class LogFollower:
    """`poll()` returns the complete lines written since the last call."""

    def __init__(self, path: Path, *, offset: int = 0, max_bytes: int = MAX_LINE_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.reopened = 0
        self._fh: BinaryIO | None = None
        self._inode: int | None = None
        self._offset = offset
        self._partial = b""
        self._skipped = 0  # bytes of an over-long line dropped before its newline came

    def _open(self) -> bool:
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return False
        self._fh = fh
        self._inode = os.fstat(fh.fileno()).st_ino
        fh.seek(self._offset)
        return True

    def _restart(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None
        self._offset = 0
        self._partial = b""
        self._skipped = 0
        self.reopened += 1

    def poll(self) -> list[bytes]:
        if self._fh is None and not self._open():
            return []
        out = self._read()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return out  # rotated away, nothing new yet: keep reading the old file
        if st.st_ino != self._inode or st.st_size < self._offset:
            # Rotated (the old file was finished above) or truncated: start over.
            self._restart()
            if self._open():
                out += self._read()
        return out

    def _read(self) -> list[bytes]:
        assert self._fh is not None
        lines: list[bytes] = []
        while chunk := self._fh.read(_READ):
            self._offset += len(chunk)
            pieces = (self._partial + chunk).split(b"\n")
            self._partial = pieces.pop()
            for piece in pieces:
                lines.append(self._cut(piece) if self._skipped else visible(piece, self.max_bytes))
            if len(self._partial) > self.max_bytes * 4:
                # No newline in sight: keep the head, count the rest.
                self._skipped += len(self._partial) - self.max_bytes
                self._partial = self._partial[: self.max_bytes]
        return lines

    def _cut(self, piece: bytes) -> bytes:
        skipped, self._skipped = self._skipped, 0
        more = skipped + max(0, len(piece) - self.max_bytes)
        return piece[: self.max_bytes] + f" … [{more} more bytes cut]".encode()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None
