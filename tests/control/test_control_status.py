"""`status` judged from the lock, the stream's tail and run.json (the lock is held by this
test process where a live trainer is needed; the lifecycle tests use the real one)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from control_harness import cli, run_start_fields, step_fields, write_stream

from dflash_train.control import run_status as run_status_module
from dflash_train.rundir import RunDir, RunLock, atomic_write_json
from dflash_train.stream import reader as stream_reader


def _started(rundir: RunDir, run_id: str, at: float) -> None:
    atomic_write_json(
        rundir.run_json,
        {"run_id": run_id, "pid": os.getpid(), "pgid": os.getpgrp(), "started_at": at},
    )


def test_not_started(tmp_path: Path) -> None:
    rc, reply = cli("status", str(tmp_path))
    assert rc == 0 and reply.data["state"] == "not_started"
    rc, reply = cli("status", str(tmp_path / "missing"))
    assert rc == 1 and reply.error_code == "run_dir_missing"


def test_finished_reports_reason_and_last_step(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_stream(
        rundir.status,
        "run-f",
        [
            ("run_start", run_start_fields()),
            ("step", step_fields(0)),
            ("step", step_fields(1)),
            ("heartbeat", {}),
            ("run_end", {"reason": "completed", "exit_code": 0}),
        ],
    )
    rc, reply = cli("status", str(tmp_path))
    assert rc == 0
    data = reply.data
    assert data["state"] == "finished" and data["reason"] == "completed"
    assert (data["run_id"], data["last_seq"], data["last_step"]) == ("run-f", 4, 1)
    assert data["total_steps"] == 100


def test_crashed_carries_the_log_tail(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_stream(
        rundir.status,
        "run-c",
        [("run_start", run_start_fields()), *[("step", step_fields(i)) for i in range(3)]],
    )
    rundir.log.write_text("".join(f"line {i}\n" for i in range(100)) + "Killed\n")
    _, reply = cli("status", str(tmp_path))
    assert reply.data["state"] == "crashed" and reply.data["last_step"] == 2
    assert reply.data["log_tail"][-1] == "Killed" and len(reply.data["log_tail"]) == 30


def test_running_then_stalled(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    now = time.time()
    _started(rundir, "run-r", now - 600)
    with RunLock(rundir.lock):
        write_stream(
            rundir.status, "run-r", [("run_start", run_start_fields()), ("step", step_fields(7))]
        )
        _, reply = cli("status", str(tmp_path), "--stall-after", "30")
        assert reply.data["state"] == "running" and reply.data["pid"] == os.getpid()
        assert reply.data["last_step"] == 7 and reply.data["last_line_age"] < 30
        write_stream(rundir.status, "run-r", [("heartbeat", {})], t0=now - 100)
        _, reply = cli("status", str(tmp_path), "--stall-after", "30")
        assert reply.data["state"] == "stalled" and reply.data["quiet_s"] >= 99


def test_a_launch_that_wrote_nothing_yet(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    # The previous run of the directory finished; a new launch has started since.
    write_stream(
        rundir.status,
        "run-old",
        [("run_start", run_start_fields()), ("run_end", {"reason": "completed", "exit_code": 0})],
        t0=time.time() - 50,
    )
    _started(rundir, "run-new", time.time() - 5)
    with RunLock(rundir.lock):
        _, reply = cli("status", str(tmp_path), "--stall-after", "30")
    assert reply.data["state"] == "running" and reply.data["starting"] is True
    assert reply.data["run_id"] == "run-new" and reply.data["last_seq"] is None
    # The same launch died before writing a line: crashed, not the old run's "finished".
    _, reply = cli("status", str(tmp_path))
    assert reply.data["state"] == "crashed" and reply.data["run_id"] == "run-new"


def test_a_long_run_whose_run_start_is_far_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rundir = RunDir.at(tmp_path)
    steps = [("step", step_fields(i)) for i in range(200)]
    write_stream(rundir.status, "run-l", [("run_start", run_start_fields()), *steps])
    monkeypatch.setattr(stream_reader, "TAIL_BYTES", 4096)  # the tail misses run_start
    with RunLock(rundir.lock):
        info = run_status_module.run_status(rundir)
    assert info["state"] == "running" and info["starting"] is False
    assert info["total_steps"] == 100 and info["last_step"] == 199
