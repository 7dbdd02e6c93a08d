"""`dflash-train tail` never sends a line over 1 MiB (protocol.MAX_LINE_BYTES): it sends a
small notice in its place, which every reader counts as rejected with reason `oversized`,
and it never holds more than about one bound of such a line in memory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from control_harness import dflash_argv, run_start_fields, step_fields, write_stream

from dflash_train import protocol
from dflash_train.stream.follower import StreamFollower

HUGE = 3 * protocol.MAX_LINE_BYTES


def _huge_event(seq: int, run: str) -> bytes:
    record = {"v": 1, "seq": seq, "t": 1.0, "run": run, "kind": "event", "level": "info"}
    record |= {"code": "x", "message": "m" * HUGE}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _stream_with_huge_lines(run_dir: Path) -> Path:
    """seq 0..2 good, seq 3 a 3 MiB event, 2 MiB of garbage, seq 4..5 good."""
    path = run_dir / "status.jsonl"
    run_dir.mkdir(parents=True)
    lines = [("run_start", run_start_fields())] + [("step", step_fields(i)) for i in (1, 2)]
    write_stream(path, "r1", lines)
    with path.open("ab") as fh:
        fh.write(_huge_event(3, "r1"))
        fh.write(b"\xff" * (2 * protocol.MAX_LINE_BYTES) + b"\n")
        for seq in (4, 5):
            line = protocol.encode_line("step", seq=seq, run="r1", **step_fields(seq))
            fh.write(line.encode())
    return path


def _tail(run_dir: Path, *args: str) -> list[bytes]:
    done = subprocess.run(
        dflash_argv("tail", str(run_dir), *args), capture_output=True, timeout=60, check=True
    )
    return done.stdout.splitlines()


def test_oversized_lines_are_skipped_on_the_box_and_counted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _stream_with_huge_lines(run_dir)
    for args in ((), ("--history", "50")):
        out = _tail(run_dir, *args)
        assert max(len(line) for line in out) < 1000, "a huge line was sent"
        decoded = [protocol.decode_line(line) for line in out]
        good = [d.seq for d in decoded if isinstance(d, protocol.StatusLine)]
        if args:  # the summary, then its history_end marker (which repeats the last seq)
            assert {0, 5} <= set(good) <= {0, 1, 2, 4, 5}
        else:
            assert good == [0, 1, 2, 4, 5]
        rejected = [d for d in decoded if isinstance(d, protocol.Rejected)]
        assert [r.code for r in rejected] == ["oversized", "oversized"], args
        assert "line 3 (event)" in rejected[0].reason and str(len(_huge_event(3, "r1")) - 1) in (
            rejected[0].reason
        )
    # A resuming reader past the huge line is not told about it again.
    out = _tail(run_dir, "--from-seq", "3", "--run", "r1")
    assert [protocol.decode_line(line).seq for line in out] == [4, 5]  # type: ignore[union-attr]


def test_a_huge_line_still_being_written_is_never_held_whole(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    write_stream(path, "r1", [("run_start", run_start_fields())])
    follower = StreamFollower(path)
    assert len(list(follower.poll())) == 1
    head = _huge_event(1, "r1")
    with path.open("ab") as fh:
        fh.write(head[: 2 * protocol.MAX_LINE_BYTES])  # half written, no newline yet
    assert list(follower.poll()) == []
    assert len(follower._partial) <= protocol.MAX_LINE_BYTES  # only its head is kept
    with path.open("ab") as fh:
        fh.write(head[2 * protocol.MAX_LINE_BYTES :])
        fh.write(protocol.encode_line("step", seq=2, run="r1", **step_fields(2)).encode())
    got = [protocol.decode_line(line) for line in follower.poll()]
    assert isinstance(got[0], protocol.Rejected) and got[0].code == "oversized"
    assert isinstance(got[1], protocol.StatusLine) and got[1].seq == 2
    assert follower.oversized == 1
    follower.close()
