"""Session over the local transport against the real `dflash-train tail`: delivery, the
resume cursor across a killed tail, history on first attach, a new run id, reconnect
reporting, the read-only gate and input checks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dflash_train.protocol import MAX_LINE_BYTES, Rejected, StatusLine
from dflash_train.stream.writer import StatusWriter
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.session import (
    ConnectionState,
    InputError,
    ReadOnlyError,
    Session,
    trainer_prefix,
)
from dflash_tui.sources.state import RunState
from dflash_tui.sources.transport import LocalTransport
from tests.tui.conftest import write_steps

# The box side of these tests runs this interpreter: `PYTHON -m dflash_train`.
TRAINER_PYTHON = sys.executable
FAST = Backoff(initial=0.05, cap=0.2)
# Records each command's pid, then runs it: lets a test kill "the connection" (the tail).
PID_LOGGING = ("sh", "-c", 'echo $$ >> "$0"; exec "$@"')


class Recorder:
    def __init__(self) -> None:
        self.lines: list[StatusLine] = []
        self.rejected: list[Rejected] = []
        self.states: list[ConnectionState] = []

    def session(self, transport: LocalTransport, run_dir: Path, **kw: object) -> Session:
        return Session(
            transport,
            run_dir=str(run_dir),
            python=TRAINER_PYTHON,
            read_only=kw.pop("read_only", False),  # type: ignore[arg-type]
            on_line=self.lines.append,
            on_reject=self.rejected.append,
            on_connection=self.states.append,
            backoff=FAST,
            **kw,  # type: ignore[arg-type]
        )

    def seqs(self, run: str | None = None) -> list[int]:
        return [
            ln.seq
            for ln in self.lines
            if (run is None or ln.run == run) and not ln.get("history") and ln.kind != "event"
        ]


async def wait_for(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_trainer_prefix() -> None:
    assert trainer_prefix(None) == ("dflash-train",)
    assert trainer_prefix("dflash-train") == ("dflash-train",)
    assert trainer_prefix("/opt/py") == ("/opt/py", "-m", "dflash_train")
    with pytest.raises(InputError, match="python: contains a newline"):
        trainer_prefix("/opt/py\n; rm")


async def test_follow_delivers_and_resumes_after_the_tail_dies(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_steps(run_dir, "runA", 30)
    pids = tmp_path / "pids"
    rec = Recorder()
    session = rec.session(LocalTransport((*PID_LOGGING, str(pids))), run_dir, history_points=0)
    task = asyncio.create_task(session.follow())
    await wait_for(lambda: len(rec.lines) == 30)
    assert session.cursor == ("runA", 29)
    assert [s.status for s in rec.states[:2]] == ["connecting", "connected"]
    writer = StatusWriter(run_dir / "status.jsonl", "runA")
    for drop in range(3):
        for _ in range(10):
            writer.write("heartbeat")
        first_pid = int(pids.read_text().split()[-1])
        os.kill(first_pid, signal.SIGKILL)  # the "connection" dies mid-stream
        for _ in range(10):
            writer.write("heartbeat")
        await wait_for(lambda d=drop: len(rec.lines) == 30 + 20 * (d + 1))
    assert rec.seqs("runA") == list(range(90))
    reconnects = [s for s in rec.states if s.status == "reconnecting"]
    assert len(reconnects) == 3 and all(s.attempt == 1 for s in reconnects)
    assert reconnects[0].next_in is not None and reconnects[0].next_in <= 0.05
    assert "exit" in (reconnects[0].reason or "")
    await stop(task)
    writer.close()


async def test_a_skipped_oversized_line_is_counted_once_across_a_reconnect(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    write_steps(run_dir, "runA", 5)
    record = {"v": 1, "seq": 5, "t": 1.0, "run": "runA", "kind": "event", "level": "info"}
    record |= {"code": "x", "message": "m" * (2 * MAX_LINE_BYTES)}
    with (run_dir / "status.jsonl").open("ab") as fh:
        fh.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
    pids = tmp_path / "pids"
    rec = Recorder()
    session = rec.session(LocalTransport((*PID_LOGGING, str(pids))), run_dir, history_points=0)
    task = asyncio.create_task(session.follow())
    await wait_for(lambda: len(rec.lines) == 5 and len(rec.rejected) == 1, timeout=20)
    assert rec.rejected[0].code == "oversized" and rec.rejected[0].of_seq == 5
    # The skipped line used up seq 5: a resumed tail starts after it.
    assert session.cursor == ("runA", 5)
    assert session.tail_argv()[-4:] == ["--from-seq", "5", "--run", "runA"]
    os.kill(int(pids.read_text().split()[-1]), signal.SIGKILL)  # the connection drops
    writer = StatusWriter(run_dir / "status.jsonl", "runA")
    writer.write("heartbeat")
    await wait_for(lambda: len(rec.lines) == 6)
    assert rec.lines[-1].seq == 6 and len(rec.rejected) == 1
    assert len(pids.read_text().split()) == 2  # it did reconnect
    await stop(task)
    writer.close()


async def test_first_attach_gets_a_summary_then_live_lines(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_steps(run_dir, "old", 2000)
    rec = Recorder()
    session = rec.session(LocalTransport(), run_dir, history_points=40)
    task = asyncio.create_task(session.follow())
    await wait_for(lambda: any(ln.get("code") == "history_end" for ln in rec.lines))
    summary = [ln for ln in rec.lines if ln.get("history")]
    assert len(summary) < 200
    assert session.cursor == ("old", 1999)
    writer = StatusWriter(run_dir / "status.jsonl", "old")
    writer.write("heartbeat")
    await wait_for(lambda: rec.lines[-1].seq == 2000)
    assert not rec.lines[-1].get("history")
    await stop(task)
    writer.close()


async def test_a_new_run_id_resets_the_cursor(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_steps(run_dir, "first", 5)
    rec = Recorder()
    session = rec.session(LocalTransport(), run_dir, history_points=0)
    task = asyncio.create_task(session.follow())
    await wait_for(lambda: len(rec.lines) == 5)
    write_steps(run_dir, "second", 3)  # rotates the old stream away, starts at seq 0
    await wait_for(lambda: session.cursor == ("second", 2))
    assert rec.seqs("second") == [0, 1, 2]
    await stop(task)


async def test_follow_gives_up_after_max_attempts(tmp_path: Path) -> None:
    rec = Recorder()
    # A summary of 1 point is refused by the box, at once, every time.
    session = rec.session(LocalTransport(), tmp_path, max_attempts=2, history_points=1)
    await asyncio.wait_for(session.follow(), 60)
    assert rec.states[-1].status == "failed"
    reason = rec.states[-1].reason or ""
    assert "gave up after 2 retries" in reason
    # tail answered with a JSON error reply: its message is the reason, not a bad line.
    assert "history: 1 is below 2 points" in reason
    assert not rec.rejected and not rec.lines


async def test_a_missing_run_dir_waits_for_a_wake_instead_of_retrying(tmp_path: Path) -> None:
    rec = Recorder()
    transport = LocalTransport()
    session = rec.session(transport, tmp_path / "absent")
    follow = asyncio.create_task(session.follow())
    try:
        await wait_for(lambda: bool(rec.states) and rec.states[-1].status == "no_run")
        await asyncio.sleep(1.0)  # it looks again each backoff cap (0.3 s), quietly
        assert [s.status for s in rec.states] == ["connecting", "connected", "no_run"]
        session.backoff = Backoff(initial=3600.0, cap=3600.0)
        session.wake()  # one more look (now the cap is an hour), still no run
        await asyncio.sleep(1.0)
        assert [s.status for s in rec.states] == ["connecting", "connected", "no_run"]
        assert "no run in" in (rec.states[-1].reason or "")
        write_steps(tmp_path / "absent", "r1", 3)
        session.wake()  # what a launch or the operator's `r` does
        await wait_for(lambda: len(rec.lines) >= 3)
        assert [s.status for s in rec.states] == ["connecting", "connected", "no_run", "connected"]
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow


async def test_read_only_session_refuses_before_anything_runs(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    rec = Recorder()
    session = rec.session(
        LocalTransport((*PID_LOGGING, str(pids))), tmp_path / "run", read_only=True
    )
    assert session.read_only
    with pytest.raises(AttributeError):
        session.read_only = False  # type: ignore[misc]
    calls = [
        session.launch(["--epochs", "1"]),
        session.stop(),
        session.restart(fresh=True, overrides={}),
        session.set_setting("hs_min_ready", "3"),
    ]
    for call in calls:
        with pytest.raises(ReadOnlyError, match="watch mode"):
            await call
    assert not pids.exists()
    await session.status()  # reading is allowed
    assert len(pids.read_text().split()) == 1


async def test_bad_input_is_refused_naming_the_field(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    rec = Recorder()
    transport = LocalTransport((*PID_LOGGING, str(pids)))
    session = rec.session(
        transport,
        tmp_path / "run",
        settings_in_force=lambda: {"hs_queue_depth": 8, "hs_min_ready": 2},
    )
    cases = [
        (session.launch(["--lr", "1e-4\n--evil"]), "launch argument 2: contains a newline"),
        (session.launch(["a\0b"]), "launch argument 1: contains a NUL byte"),
        (session.set_setting("hs_min_ready", "many"), "hs_min_ready: expected an integer"),
        (session.set_setting("hs_min_ready", "30"), r"hs_min_ready: 30 is out of range 1\.\."),
        (session.set_setting("batch", "3"), "batch: unknown setting"),
        (session.restart(overrides={"lr; rm": "1"}), "not an option name"),
        (session.restart(overrides={"lr": "1\r"}), "restart override lr: contains a carriage"),
        (session.stop(timeout=0), "timeout: 0 must be above 0"),
    ]
    for call, message in cases:
        with pytest.raises(InputError, match=message):
            await call
    assert not pids.exists()
    for bad_dir, message in (("-rf", "starts with '-'"), ("a\nb", "newline"), (" ", "empty")):
        with pytest.raises(InputError, match=f"run_dir: .*{message}"):
            Session(transport, run_dir=bad_dir, read_only=False, on_line=rec.lines.append)


async def test_failed_commands_become_error_replies(tmp_path: Path) -> None:
    rec = Recorder()
    missing = Session(
        LocalTransport(),
        run_dir=str(tmp_path),
        python="/nonexistent/python",
        read_only=False,
        on_line=rec.lines.append,
    )
    reply = await missing.status()
    # Exit 127 (no such command) names what to fix: the trainer's python.
    assert not reply.ok and reply.error_code == "no_trainer"
    assert "exit 127" in (reply.error or "") and "nonexistent" in (reply.error or "")
    assert "set python" in (reply.error or "")
    slow = Session(
        LocalTransport(("sh", "-c", "sleep 5", "sh")),
        run_dir=str(tmp_path),
        read_only=False,
        on_line=rec.lines.append,
        control_timeout=0.3,
    )
    reply = await slow.status()
    assert not reply.ok and reply.error_code == "timeout"
    assert "may still be running" in (reply.error or "")


async def test_follow_gpus_feeds_box_readings_apart_from_the_run(tmp_path: Path) -> None:
    gpu_lines: list[StatusLine] = []
    run_lines: list[StatusLine] = []
    session = Session(
        LocalTransport(),
        run_dir=str(tmp_path),
        python=TRAINER_PYTHON,
        read_only=True,
        on_line=run_lines.append,
        on_gpu_line=gpu_lines.append,
    )
    with pytest.raises(InputError, match="interval: 0 must be above 0"):
        await session.follow_gpus(interval=0)
    task = asyncio.create_task(session.follow_gpus(interval=0.1))
    await wait_for(lambda: len(gpu_lines) >= 3)
    await stop(task)
    assert not run_lines
    assert all(ln.kind == "gpu" and ln.run == "gpus" for ln in gpu_lines)
    assert [ln.seq for ln in gpu_lines[:3]] == [0, 1, 2]
    state = RunState()
    for ln in gpu_lines:
        state.apply(ln)
    assert state.run_id is None  # box telemetry is not a run
    # No NVML on this machine: the reason is shown instead of a table.
    assert gpu_lines[-1]["available"] is False and state.gpu_unavailable
