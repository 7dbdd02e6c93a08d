"""A resumed StatusWriter continues its run's seq after the stream's last line, even when
that line is one too long for readers to get (`tail` sends a notice instead): its seq was
used, and a writer that started again at 0 would have every reader drop what follows."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_train.protocol import MAX_LINE_BYTES
from dflash_train.stream.reader import last_record
from dflash_train.stream.writer import StatusWriter


def _huge_event(seq: int, run: str, size: int) -> bytes:
    record = {"v": 1, "seq": seq, "t": 1.0, "run": run, "kind": "event", "level": "info"}
    record |= {"code": "x", "message": "m" * size}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def test_seq_continues_after_an_oversized_last_line(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    writer = StatusWriter(path, "r1")
    for _ in range(3):
        writer.write("heartbeat")
    writer.close()
    with path.open("ab") as fh:  # 3 MiB: longer than a reader's line and a read block
        fh.write(_huge_event(3, "r1", 3 * MAX_LINE_BYTES))
    last = last_record(path)
    assert last is not None and (last.seq, last.run, last.kind) == (3, "r1", "event")
    resumed = StatusWriter(path, "r1")
    assert resumed.write("heartbeat") == 4
    resumed.close()
    assert last_record(path).seq == 4  # type: ignore[union-attr]


def test_last_record_skips_garbage_and_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    writer = StatusWriter(path, "r1")
    writer.write("heartbeat")
    writer.write("heartbeat")
    writer.close()
    with path.open("ab") as fh:
        fh.write(b"\xff" * (2 * MAX_LINE_BYTES) + b'\nnot json\n\n{"v":1,"se')
    last = last_record(path)
    assert last is not None and last.seq == 1
    assert last_record(tmp_path / "missing.jsonl") is None
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert last_record(empty) is None


def test_a_new_run_still_starts_its_own_stream(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    with path.open("ab") as fh:
        fh.write(_huge_event(7, "old", 2 * MAX_LINE_BYTES))
    writer = StatusWriter(path, "new")
    assert writer.write("heartbeat") == 0
    writer.close()
    assert (tmp_path / "status.old.jsonl").stat().st_size > 2 * MAX_LINE_BYTES
