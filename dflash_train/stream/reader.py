"""Reading status lines as raw bytes: the envelope (seq, t, run, kind) of a line read
with one regex over the prefix the status writer produces, offsets by seq, the stream's
tail and its last record. Lines are handled without their newline; reading a long stream
stays cheap because only the lines that are kept are decoded whole."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from dflash_train import protocol

# protocol.encode_line writes the envelope first, in this order, without spaces.
ENVELOPE_PREFIX = re.compile(
    rb'\{"v":\d+,"seq":(?P<seq>\d+),"t":(?P<t>[^,]*),"run":"(?P<run>(?:[^"\\]|\\.)*)",'
    rb'"kind":"(?P<kind>[A-Za-z_]+)"'
)
# A line longer than this is never sent (protocol.MAX_LINE_BYTES): `tail` sends a small
# notice in its place, and never holds more than about this much of one line in memory.
MAX_LINE = protocol.MAX_LINE_BYTES
# Enough of a line to read its envelope (the first ~150 bytes), however long the line.
HEAD_BYTES = 512
_BLOCK = 1 << 20
TAIL_BYTES = 4 << 20
_WANTED = ("run_start", "run_end", "step")


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


@dataclass(frozen=True)
class StreamFacts:
    """The newest lines of one run in the stream's tail (None where absent)."""

    last: protocol.StatusLine | None
    run_start: protocol.StatusLine | None
    run_end: protocol.StatusLine | None
    step: protocol.StatusLine | None


def tail_lines(path: Path, max_bytes: int) -> list[bytes]:
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n")
    lines = data[:end].split(b"\n") if end >= 0 else []
    # The first piece may be the end of a line cut by the seek.
    return lines[1:] if size > max_bytes else lines


def find_lines(
    path: Path, run: str | None, *, after_seq: int = -1, max_bytes: int | None = None
) -> StreamFacts:
    """Newest run_start, the run_end and step after it, and the last line, of run `run`
    (None: the stream's last run) with seq above `after_seq`. Reads only the tail and
    decodes only the lines it keeps."""
    found: dict[str, protocol.StatusLine] = {}
    last: protocol.StatusLine | None = None
    for raw in reversed(tail_lines(path, max_bytes or TAIL_BYTES)):
        env = read_envelope(raw)
        if env is None:
            continue
        if run is None:
            run = env.run
        if env.run != run:
            # One stream holds one run id, so a newest line of another run means the
            # wanted run has written nothing yet.
            break
        if env.seq <= after_seq:
            break
        if last is None or (env.kind in _WANTED and env.kind not in found):
            decoded = protocol.decode_line(raw)
            if not isinstance(decoded, protocol.StatusLine):
                continue
            last = last or decoded
            if env.kind in _WANTED:
                found.setdefault(env.kind, decoded)
        if env.kind == "run_start":
            break  # lines before it belong to an earlier start of this run id
    return StreamFacts(last, found.get("run_start"), found.get("run_end"), found.get("step"))


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
            line = fh.read(length if length <= HEAD_BYTES * 8 else HEAD_BYTES)
            env = read_envelope(line.rstrip(b"\n"))
            if env is not None:
                return env
    return None
