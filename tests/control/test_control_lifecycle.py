"""Every control command against the real trainer (`dflash-train train` with the real
SmolLM2 target and a dataset the real `prepare` wrote), as the console runs them: launch,
status, set, tail, restart (resume and fresh), stop by TERM and stop escalating to KILL.

The box is shared and a trainer takes seconds to start, so one run directory goes
through the whole life of a run across these tests, in file order."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_harness import SMALL_TRAIN, cli, decode_all, dflash_argv, end_trainer, trainer_env_args

from dflash_train import protocol
from dflash_train.rundir import RunDir, lock_is_held, read_json

SECRET = "hunter2-not-for-run-json"
LEAK = "DFLASH_TEST_CALLER_ONLY"


@pytest.fixture(scope="module")
def run_dir(
    tmp_path_factory: pytest.TempPathFactory, prepared_data_dir: Path, smollm2_spec: str
) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("lifecycle") / "run"
    os.environ[LEAK] = "1"  # in the caller's environment only: the trainer must not see it
    try:
        rc, reply = cli(
            "launch",
            str(path),
            "--wait",
            "240",
            *trainer_env_args(),
            "--env",
            f"MY_API_KEY={SECRET}",
            "--",
            "--target-model",
            smollm2_spec,
            "--data-dir",
            str(prepared_data_dir),
            *SMALL_TRAIN,
            timeout=300,
        )
    finally:
        del os.environ[LEAK]
    assert rc == 0 and reply.ok, reply
    (path / "launch-reply.json").write_text(reply.to_json())
    yield path
    end_trainer(path)


def _record(run_dir: Path) -> dict[str, Any]:
    record = read_json(RunDir.at(run_dir).run_json)
    assert isinstance(record, dict)
    return record


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _alive(pid: int) -> bool:
    """Running (not a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> protocol.StatusLine:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line within {timeout} s"
    return decode_all(proc.stdout.readline())[0]


def _wait_for_steps(run_dir: Path, steps: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, reply = cli("status", str(run_dir))
        if (reply.data.get("last_step") or 0) >= steps:
            return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {steps} steps after {timeout} s")


def test_launch_verified_detached_and_recorded(run_dir: Path) -> None:
    reply = protocol.decode_reply((run_dir / "launch-reply.json").read_text())
    assert isinstance(reply, protocol.Reply) and reply.ok
    record = _record(run_dir)
    pid = record["pid"]
    assert reply.data["pid"] == pid and reply.data["run_id"] == record["run_id"]
    assert record["pgid"] == pid == os.getpgid(pid)  # its own session and group
    assert os.getsid(pid) == pid
    assert lock_is_held(run_dir / "run.lock")
    trainer = [sys.executable, "-m", "dflash_train", "train", "--output-dir", str(run_dir)]
    assert record["argv"][:6] == trainer
    assert record["env"]["MY_API_KEY"] == "<redacted>"
    assert SECRET not in (run_dir / "run.json").read_text()
    env = _environ(pid)
    assert env["MY_API_KEY"] == SECRET and env["DFLASH_RUN_ID"] == record["run_id"]
    assert LEAK not in env
    assert Path(f"/proc/{pid}/fd/0").resolve() == Path(os.devnull)
    assert Path(f"/proc/{pid}/fd/1").resolve() == run_dir / "train.log"
    run_start = [
        line
        for line in decode_all((run_dir / "status.jsonl").read_bytes())
        if line.kind == "run_start"
    ]
    assert [line.seq for line in run_start] == [reply.data["run_start_seq"]]


def test_second_launch_is_refused_with_the_live_pid(run_dir: Path, prepared_data_dir: Path) -> None:
    rc, reply = cli(
        "launch",
        str(run_dir),
        "--",
        "--target-model",
        "smollm2",
        "--data-dir",
        str(prepared_data_dir),
        *SMALL_TRAIN,
    )
    assert rc == 1 and reply.error_code == "already_running"
    assert reply.data["pid"] == _record(run_dir)["pid"]


def test_status_of_a_live_run(run_dir: Path) -> None:
    _wait_for_steps(run_dir, 1)
    rc, reply = cli("status", str(run_dir))
    assert rc == 0 and reply.data["state"] == "running"
    assert reply.data["pid"] == _record(run_dir)["pid"]
    assert reply.data["last_line_age"] < 60 and reply.data["last_seq"] > 0


def test_set_is_applied_by_the_trainer(run_dir: Path) -> None:
    rc, reply = cli("set", str(run_dir), "hs_min_ready", "3", "--wait", "60")
    assert rc == 0 and reply.ok, reply
    assert reply.data["rev"] == 1 and reply.data["settings"]["hs_min_ready"] == 3
    control = json.loads((run_dir / "control.json").read_text())
    assert control["rev"] == 1 and control["settings"] == {"hs_min_ready": 3}
    # Judged against the values in force: a depth below min-ready is refused here.
    rc, reply = cli("set", str(run_dir), "hs_queue_depth", "2")
    assert rc == 1 and reply.error_code == "out_of_range"
    assert "hs_min_ready=3" in (reply.error or "")
    assert json.loads((run_dir / "control.json").read_text())["rev"] == 1


def test_tail_history_then_live_and_across_a_restart(run_dir: Path) -> None:
    tail = subprocess.Popen(
        dflash_argv("tail", str(run_dir), "--history", "50", "--follow", "--poll", "0.1"),
        stdout=subprocess.PIPE,
    )
    try:
        line = _read_line(tail, 30)
        while line.get("code") != "history_end":
            assert line.get("history") is True
            line = _read_line(tail, 30)
        cursor = line["cursor"]
        live = _read_line(tail, 60)
        assert live.seq == cursor + 1 and live.get("history") is None
        old_pid = _record(run_dir)["pid"]
        _wait_for_steps(run_dir, 1)
        # A bad override is refused before anything is stopped.
        rc, reply = cli("restart", str(run_dir), "--set", "hs_min_ready=99")
        assert rc == 1 and reply.error_code == "bad_override"
        assert _record(run_dir)["pid"] == old_pid and lock_is_held(run_dir / "run.lock")
        rc, reply = cli(
            "restart",
            str(run_dir),
            "--set",
            "hs_queue_depth=9",
            "--wait",
            "240",
            "--",
            "--hs-min-ready",
            "4",
            timeout=300,
        )
        assert rc == 0 and reply.ok, reply
        assert reply.data["stopped"]["stopped_by"] == "term"
        assert reply.data["stopped"]["reason"] == "signal"
        assert reply.data["resumed_from"] and reply.data["run_id"] == _record(run_dir)["run_id"]
        # The secret was never written down, so a restart cannot pass it on again.
        assert reply.data["env_dropped"] == ["MY_API_KEY"]
        record = _record(run_dir)
        assert record["pid"] != old_pid and lock_is_held(run_dir / "run.lock")
        args = record["train_args"]
        assert args[-2:] == ["--resume-from", "latest"]
        assert args.count("--hs-min-ready") == 1 and args.count("--hs-queue-depth") == 1
        assert args[args.index("--hs-min-ready") + 1] == "4"
        assert args[args.index("--hs-queue-depth") + 1] == "9"
        # The same follow, never restarted, sees the stop and the resumed start.
        kinds = []
        while True:
            line = _read_line(tail, 60)
            kinds.append(line.kind)
            if line.kind == "run_start":
                break
        assert "run_end" in kinds and line.get("resumed_from")
        assert line["settings"] == {"hs_queue_depth": 9, "hs_min_ready": 4}
    finally:
        tail.kill()
        tail.wait()


def test_stop_escalates_to_kill_for_a_trainer_that_cannot_take_term(run_dir: Path) -> None:
    pid = _record(run_dir)["pid"]
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    rc, reply = cli("stop", str(run_dir), "--timeout", "2")
    assert rc == 0 and reply.ok, reply
    assert reply.data["stopped_by"] == "kill" and reply.data["exit_code"] == 137
    assert not lock_is_held(run_dir / "run.lock")
    _, status = cli("status", str(run_dir))
    assert status.data["state"] == "stopped" and status.data["reason"] == "signal"
    rc, reply = cli("stop", str(run_dir))
    assert rc == 1 and reply.error_code == "not_running"


def test_fresh_restart_then_stop_by_term(run_dir: Path) -> None:
    old_id = _record(run_dir)["run_id"]
    rc, reply = cli("restart", str(run_dir), "--fresh", "--wait", "240", timeout=300)
    assert rc == 0 and reply.ok, reply
    assert reply.data["stopped"] is None  # nothing was running
    assert reply.data["resumed_from"] is None and reply.data["run_id"] != old_id
    assert "--resume-from" not in reply.data["train_args"]
    assert (run_dir / f"status.{old_id}.jsonl").exists()  # the old stream kept beside
    assert "MY_API_KEY" not in _record(run_dir)["env"]
    # A follower holding the old run's cursor starts over on the new stream.
    rc_tail = subprocess.run(
        dflash_argv("tail", str(run_dir), "--from-seq", "100000", "--run", old_id),
        capture_output=True,
        timeout=60,
        check=True,
    )
    lines = decode_all(rc_tail.stdout)
    assert lines[0].seq == 0 and lines[0].run == reply.data["run_id"]
    _wait_for_steps(run_dir, 1)
    rc, reply = cli("stop", str(run_dir), "--timeout", "120")
    assert rc == 0 and reply.ok, reply
    assert (reply.data["stopped_by"], reply.data["reason"], reply.data["exit_code"]) == (
        "term",
        "signal",
        0,
    )
    # stop answers once the trainer's processes are gone, not merely once the lock is free:
    # a restart's GPU preflight comes right after it.
    assert reply.data["exited"] is True
    assert _alive(reply.data["pid"]) is False
    # The trainer checkpointed on SIGTERM at the step its run_end names.
    new_run = reply.data["run_id"]  # in the fresh run's own folder
    assert (run_dir / "checkpoints" / new_run / f"step_{reply.data['step']:07d}").is_dir()
    _, status = cli("status", str(run_dir))
    assert status.data["state"] == "stopped" and status.data["reason"] == "signal"
