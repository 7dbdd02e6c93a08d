"""Alerts in the real app, following a real stream: each cause (stall, lost connection,
non-finite steps, a failed checkpoint, a crash) rings, toasts and notifies exactly once
however many lines repeat it, and the header badge names the cause."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

from dflash_train.rundir import RunLock
from dflash_train.stream.writer import StatusWriter
from dflash_tui.sources.backoff import Backoff
from dflash_tui.widgets.header import RunHeader
from tests.tui.console_harness import console_app, make_run_dir, wait_until
from tests.tui.synthetic_stream import RUN_ID

STEPS = 50


def box_processes(subcommand: str, run_dir: Path) -> list[int]:
    """Pids of this machine's `dflash_train SUBCOMMAND RUN_DIR` processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"dflash_train" in argv
            and subcommand.encode() in argv
            and str(run_dir).encode() in argv
        ):
            found.append(int(entry.name))
    return found


def badge(app) -> str:  # type: ignore[no-untyped-def]
    return str(app.screen.query_one(RunHeader).render()).splitlines()[0]


async def test_each_cause_alerts_exactly_once(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, steps=STEPS)
    now = [time.time()]
    app, _ = console_app(run_dir, clock=lambda: now[0])
    app.options = dataclasses.replace(app.options, alerts=("bell", "toast", "osc"))
    app.session.backoff = Backoff(initial=3600.0, cap=3600.0, jitter=0.0)
    writer = StatusWriter(run_dir / "status.jsonl", RUN_ID)
    # This test stands for a live trainer: `status` on the box finds the run lock held.
    lock = RunLock(run_dir / "run.lock")
    lock.acquire()

    try:
        await follow_every_cause(app, pilot_size=(160, 48), writer=writer, now=now, run_dir=run_dir)
    finally:
        lock.release()


async def follow_every_cause(app, *, pilot_size, writer, now, run_dir) -> None:  # type: ignore[no-untyped-def]
    def step(n: int) -> None:
        writer.write("step", step=n, epoch=0, epoch_progress=0.5, loss=1.0, acc=0.5, tau=2.0,
                     lr=1e-4, grad_norm=1.0, tokens=1, ktok_s=1.0)  # fmt: skip

    async with app.run_test(size=pilot_size) as pilot:
        await wait_until(pilot, lambda: app.state.step == STEPS - 1)
        causes = lambda: [a.cause for a in app.alerts.raised]  # noqa: E731

        # A stall: nothing for over a minute (on the app's clock), alerting once.
        now[0] += 61
        await wait_until(pilot, lambda: causes() == ["stall"])
        assert "STALLED" in badge(app)
        now[0] += 30
        await pilot.pause(0.6)
        step(STEPS)
        await wait_until(pilot, lambda: "stall" not in app.alerts.active)  # cleared: re-armed

        # The box's tail dies; the backoff is an hour, so the console stays disconnected.
        for pid in box_processes("tail", run_dir):
            os.kill(pid, signal.SIGKILL)
        await wait_until(pilot, lambda: app.connection == "reconnecting")
        now[0] += 30
        await pilot.pause(0.6)
        assert causes() == ["stall"]  # lost for 30 s is not yet worth a bell
        now[0] += 31
        await wait_until(pilot, lambda: causes() == ["stall", "connection_lost"])
        assert "CONNECTION LOST" in badge(app)
        writer.write("heartbeat")  # the trainer lives on meanwhile; the resume brings it
        await pilot.press("r")  # reconnect now
        await wait_until(pilot, lambda: app.connection == "connected")

        # Repeated lines of one cause: one alert each.
        for n in range(3):
            writer.write("event", level="error", code="nonfinite_step",
                         message=f"step {STEPS + n}: loss is nan; step skipped")  # fmt: skip
        await wait_until(pilot, lambda: "nonfinite" in causes())
        assert "NAN STEPS" in badge(app)
        for _ in range(2):
            writer.write("event", level="error", code="checkpoint_failed",
                         message="checkpoint at step 52 not written: no space left")  # fmt: skip
        writer.write("run_end", reason="error", exit_code=1, error_tail="RuntimeError: boom")
        writer.close()
        await wait_until(pilot, lambda: "crash" in causes())
        await pilot.pause(0.6)
        assert causes() == ["stall", "connection_lost", "nonfinite", "checkpoint_failed", "crash"]
        assert "CRASHED" in badge(app)
        assert "boom" in app.alerts.raised[-1].text

        # Every channel carried every alert, once.
        titles = [title for title, _ in app.toasts]
        assert titles == ["run stalled", "connection lost", "non-finite step",
                          "checkpoint failed", "run crashed"]  # fmt: skip
        assert app.bells == 5
        assert len(app.escapes_written) == 5
        assert all(e.startswith("\x1b]9;dflash: ") and "\x1b]777;notify;" in e
                   for e in app.escapes_written)  # fmt: skip
        # Dismissed: the toasts go, the badge says the run's state again.
        await pilot.press("d")
        await pilot.pause()
        assert not app._notifications and "CRASHED" in badge(app)
