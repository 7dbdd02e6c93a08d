"""`dflash-train tail`: the stream past a cursor written to stdout, first as a summary
when asked, then followed until the reader goes away."""

from __future__ import annotations

import itertools
import select
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dflash_train.control.trainer_watch import TrainerWatch
from dflash_train.stream.follower import StreamFollower
from dflash_train.stream.reader import line_time

_CHUNK = 1 << 20


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
    lock: Path | None = None,
) -> None:
    """Write the stream's lines past `from_seq` to `out`, first as a summary when
    `history_points` is given; with `follow`, keep writing new lines until `out` closes
    (BrokenPipeError propagates to the caller), and, given the run's `lock`, the
    `trainer_gone` marker when its holder dies without a run_end."""
    follower = StreamFollower(path, from_seq=from_seq, run=run)
    watch = TrainerWatch(lock, path) if lock is not None else None
    try:
        if watch is not None:
            watch.saw_lines()  # a holder alive as the tail starts is watched from here on
        if history_points is not None:
            _write_history(path, out, follower, history_points, whole=from_seq < 0 and not run)
        else:
            lines = follower.poll()
            first = next(lines, None)
            if first is not None:
                if watch is not None:
                    # Probed again once lines are read and before they are sent: a writer
                    # that took the lock after the first probe is alive now, and a reader
                    # that acts on these lines (kills, deletes) acts after this probe.
                    watch.saw_lines()
                _write(out, itertools.chain([first], lines))
        out.flush()
        while follow:
            # Looked at while lines flow too: the watch must see the holder alive first.
            sent = (follower.run, follower.cursor) if follower.run is not None else None
            marker = watch.check(sent) if watch is not None else None
            if marker is not None:
                _write(out, iter([marker]))
                out.flush()
            lines = follower.poll()
            first = next(lines, None)
            if first is not None:
                if watch is not None:
                    watch.saw_lines()  # before they are sent: their writer is alive now
                _write(out, itertools.chain([first], lines))
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
    from dflash_train.stream import summary_cache as history_cache
    from dflash_train.stream.summary import HistorySummary, end_marker

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
