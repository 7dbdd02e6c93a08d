"""Fault: the trainer is SIGKILLed, once mid-step and once mid-checkpoint (held inside the
real save path by the checkpoint module's test hook, after its files are written and
before the completion marker). Asserted: `status` says `crashed` with the train.log tail
(and the console's state follows it), `restart` resumes from the newest *complete*
checkpoint under the same run id, the half-written checkpoint is never loaded, and the
resumed run trains past the step where it was killed. The console on the box shows the
crash and the log tail."""

from __future__ import annotations

import time
from pathlib import Path

from dflash_train.checkpoint.store import STALL_ENV, is_complete, latest_checkpoint, step_dir_name
from dflash_train.protocol import Reply, StatusLine
from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.sources.transport import LocalTransport
from tests.reliability import box
from tests.reliability.console_side import BOX_PYTHON

STALL_AT = 6


def crashed_status(run_dir: Path) -> Reply:
    """`status` right after a SIGKILL: the lock is free at once, no run_end was written."""
    reply = box.status(run_dir)
    assert reply.ok and reply.data["state"] == "crashed", reply
    tail = reply.data["log_tail"]
    assert isinstance(tail, list) and tail, reply
    return reply


def restart(run_dir: Path, *env: str) -> Reply:
    options = box.env_options(box.trainer_env()) + [w for e in env for w in ("--env", e)]
    reply = box.control("restart", str(run_dir), "--wait", "200", *options, timeout=300)
    assert reply.ok, reply
    return reply


def newest_start(run_dir: Path) -> StatusLine:
    return [ln for ln in box.lines(run_dir) if ln.kind == "run_start"][-1]


async def console_shows_crash(run_dir: Path) -> None:
    """The real console on this box: its check of `status` turns the silent stream into
    `crashed` and puts the train.log tail in the events pane."""
    options = ConsoleOptions(
        target_name="local", run_dir=str(run_dir), python=BOX_PYTHON, follow_gpus=False
    )
    app = DflashApp(LocalTransport(), options)
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 60
        while app.state.step is None:
            assert time.monotonic() < deadline, "the console never showed the run"
            await pilot.pause(0.1)
        assert app.state.run_state == "running"  # the stream alone cannot tell
        app.check_status()
        while not app.log_tail:
            assert time.monotonic() < deadline, "no log tail shown"
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        assert app.state.run_state == "crashed" and app.badge() == "crashed"
        assert "train.log" in app.export_screenshot()  # the tail, under its heading


async def test_sigkill_mid_step_then_mid_checkpoint_resumes_from_last_complete(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    run_dir = tmp_path / "run"
    args = box.tiny_train_args(
        smollm2_spec,
        prepared_data_dir,
        "--pipeline", "async",
        "--epochs", "1000",
        "--save-every", "2",
        "--keep-checkpoints", "5",
    )  # fmt: skip
    options = ["--wait", "200", *box.env_options(box.trainer_env())]
    reply = box.control(
        "launch", str(run_dir), *options, "--env", f"{STALL_ENV}={STALL_AT}", "--", *args,
        timeout=300,
    )  # fmt: skip
    assert reply.ok, reply
    run_id = reply.data["run_id"]
    ckpts = run_dir / "checkpoints" / run_id  # the run's own folder
    try:
        # 1. SIGKILL mid-step, with a checkpoint behind it.
        box.wait_line(run_dir, lambda ln: ln.kind == "checkpoint", what="a checkpoint")
        saved = box.wait_line(run_dir, lambda ln: ln.kind == "checkpoint")["step"]
        box.wait_line(run_dir, lambda ln: ln.kind == "step" and ln["step"] > saved)
        box.sigkill(run_dir)
        crashed_status(run_dir)
        await console_shows_crash(run_dir)
        newest = latest_checkpoint(ckpts)
        assert newest is not None
        back = restart(run_dir)
        assert back.data["resumed_from"] == str(newest) and back.data["run_id"] == run_id
        start = newest_start(run_dir)
        assert start.run == run_id and start["resumed_from"] == str(newest)
        resumed_at = start["start_step"]
        assert resumed_at == int(newest.name.split("_")[1]) >= saved

        # 2. SIGKILL mid-checkpoint: the save of STALL_AT hangs before its marker.
        partial = ckpts / f".tmp-{step_dir_name(STALL_AT)}"
        deadline = time.monotonic() + 120
        while not (partial / "trainer_state.json").exists():
            assert time.monotonic() < deadline, "the save never reached the hook"
            time.sleep(0.1)
        box.sigkill(run_dir)
        crashed_status(run_dir)
        assert partial.is_dir() and not is_complete(partial)
        assert not (ckpts / step_dir_name(STALL_AT)).exists()
        newest = latest_checkpoint(ckpts)
        assert newest is not None and newest.name == step_dir_name(STALL_AT - 2)
        back = restart(run_dir, f"{STALL_ENV}=")
        assert back.data["resumed_from"] == str(newest)
        start = newest_start(run_dir)
        assert start["resumed_from"] == str(newest) and start["start_step"] == STALL_AT - 2
        # It trains through the step it died saving, and that checkpoint now completes.
        box.wait_line(
            run_dir,
            lambda ln: ln.kind == "checkpoint" and ln["step"] == STALL_AT,
            what=f"checkpoint {STALL_AT}",
        )
        assert is_complete(ckpts / step_dir_name(STALL_AT)) and not partial.exists()
        stopped = box.control("stop", str(run_dir), "--timeout", "60")
        assert stopped.ok and stopped.data["reason"] == "signal", stopped
    finally:
        box.kill_run(run_dir)
    # One stream, one run id, seq without a gap or a repeat across both kills, and every
    # line well formed (box.lines fails on a torn line).
    lines = box.lines(run_dir)
    assert {ln.run for ln in lines} == {run_id}
    assert [ln.seq for ln in lines] == list(range(len(lines)))
    assert [ln["start_step"] for ln in lines if ln.kind == "run_start"] == [
        0,
        resumed_at,
        STALL_AT - 2,
    ]
    assert box.status(run_dir).data["state"] == "stopped"  # by `stop`: resumable
