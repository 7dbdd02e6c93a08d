"""`tail`: lines past a cursor, complete lines only, across growth, a new run in the same
directory and a replaced file, and a follow that ends when its reader goes away."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

from control_harness import (
    cli,
    decode_all,
    dflash_argv,
    run_start_fields,
    step_fields,
    write_stream,
)

from dflash_train.rundir import RunDir
from dflash_train.stream.follower import StreamFollower
from dflash_train.stream.reader import offset_after_seq, read_envelope


def _steps(n: int, first: int = 0) -> list[tuple[str, dict]]:
    return [("step", step_fields(first + i)) for i in range(n)]


def _tail(*args: str) -> list:
    done = subprocess.run(
        dflash_argv("tail", *args),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return decode_all(done.stdout)


def test_tail_sends_lines_past_the_cursor(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_stream(rundir.status, "run-a", [("run_start", run_start_fields()), *_steps(20)])
    everything = _tail(str(tmp_path))
    assert [line.seq for line in everything] == list(range(21))
    after = _tail(str(tmp_path), "--from-seq", "15", "--run", "run-a")
    assert [line.seq for line in after] == [16, 17, 18, 19, 20]
    # A cursor of another run means another stream: start from its beginning.
    other = _tail(str(tmp_path), "--from-seq", "15", "--run", "run-old")
    assert [line.seq for line in other] == list(range(21))


def test_tail_of_a_missing_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    rc, reply = cli("tail", str(tmp_path / "nope"), "--from-seq", "3")
    assert rc == 2 and not reply.ok and reply.error_code == "run_dir_missing"
    assert "nope" in (reply.error or "")


def test_follower_never_yields_half_a_line(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    write_stream(path, "run-a", _steps(2))
    follower = StreamFollower(path)
    assert [read_envelope(x).seq for x in follower.poll()] == [0, 1]  # type: ignore[union-attr]
    whole = write_stream(tmp_path / "other.jsonl", "run-a", _steps(1, first=2))
    line = (tmp_path / "other.jsonl").read_bytes()
    assert whole == 0
    line = line.replace(b'"seq":0', b'"seq":2')
    with path.open("ab") as fh:
        fh.write(line[:40])
        fh.flush()
        assert list(follower.poll()) == []
        fh.write(line[40:])
    got = list(follower.poll())
    assert len(got) == 1 and read_envelope(got[0]).seq == 2  # type: ignore[union-attr]
    assert got[0] + b"\n" == line


def test_follower_starts_over_for_a_new_run_and_a_replaced_file(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_stream(rundir.status, "run-a", _steps(5))
    follower = StreamFollower(rundir.status, from_seq=2, run="run-a")
    assert [read_envelope(x).seq for x in follower.poll()] == [3, 4]  # type: ignore[union-attr]
    # The old run's last line, then a new run id in the same directory (the writer
    # rotates the old stream away), both before the follower looks again.
    write_stream(rundir.status, "run-a", [("run_end", {"reason": "signal", "exit_code": 0})])
    write_stream(rundir.status, "run-b", _steps(3))
    assert (tmp_path / "status.run-a.jsonl").exists()
    got = [read_envelope(x) for x in follower.poll()]
    assert [(e.run, e.seq, e.kind) for e in got] == [  # type: ignore[union-attr]
        ("run-a", 5, "run_end"),
        ("run-b", 0, "step"),
        ("run-b", 1, "step"),
        ("run-b", 2, "step"),
    ]
    assert follower.resets == 1
    # Truncated in place and rewritten (same inode, smaller): also a new stream.
    rundir.status.write_bytes(b"")
    write_stream(rundir.status, "run-b", _steps(1))
    assert [read_envelope(x).seq for x in follower.poll()] == [0]  # type: ignore[union-attr]


def test_follower_passes_malformed_lines_on_after_the_cursor(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    write_stream(path, "run-a", _steps(3))
    with path.open("ab") as fh:
        fh.write(b"{not json\n")
    write_stream(path, "run-a", _steps(1, first=3))
    fresh = list(StreamFollower(path).poll())
    assert b"{not json" in fresh and len(fresh) == 5
    resumed = list(StreamFollower(path, from_seq=1, run="run-a").poll())
    assert len(resumed) == 3 and b"{not json" in resumed


def test_offset_after_seq_lands_before_the_wanted_line(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    write_stream(path, "run-a", _steps(3000))
    data = path.read_bytes()
    for seq in (0, 1, 777, 2998, 2999, 5000):
        offset = offset_after_seq(path, seq, linear_below=512)
        skipped = data[:offset].splitlines()
        assert all(read_envelope(x).seq <= seq for x in skipped)  # type: ignore[union-attr]
        assert len(skipped) >= min(seq, 2999) - 10  # it really skipped ahead


def test_follow_streams_growth_and_exits_when_its_reader_goes(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_stream(rundir.status, "run-a", _steps(3))
    proc = subprocess.Popen(
        dflash_argv(
            "tail", str(tmp_path), "--from-seq", "0", "--run", "run-a", "--follow", "--poll", "0.05"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert decode_all(proc.stdout.readline())[0].seq == 1
        assert decode_all(proc.stdout.readline())[0].seq == 2
        write_stream(rundir.status, "run-a", _steps(1, first=3))
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "the follow did not pass on a new line"
        assert decode_all(proc.stdout.readline())[0].seq == 3
        # Idle, then the reader goes away (an SSH channel closing): the follow must end
        # by itself although nothing more is written.
        proc.stdout.close()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]


def test_follow_waits_for_a_stream_that_does_not_exist_yet(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        dflash_argv("tail", str(tmp_path), "--follow", "--poll", "0.05"),
        stdout=write_fd,
    )
    os.close(write_fd)
    try:
        time.sleep(0.5)
        write_stream(rundir.status, "run-a", _steps(2))
        with os.fdopen(read_fd, "rb") as out:
            first = out.readline()
            assert decode_all(first)[0].seq == 0
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
