"""SVG snapshots of an alert toast over the dashboard and of the log screen. Deterministic:
a fixed stream and train.log, a frozen clock, UTC times and a relative run directory."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from dflash_train import protocol
from dflash_train.stream.reader import last_record
from dflash_tui.app import DflashApp
from dflash_tui.screens.log_screen import LogScreen
from tests.tui.console_harness import console_app, wait_until
from tests.tui.synthetic_stream import RUN_ID, T0, write_stream

STEPS = 600
SIZE = (140, 42)
FROZEN = T0 + 340.0  # ten seconds after the stream's last line: a live run


@pytest.fixture
def fixed_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    write_stream(tmp_path / "run", STEPS)
    rows = [f"step {n} loss {2 + 1 / (n + 1):.4f} ktok/s 118.{n % 10}" for n in range(60)]
    rows[41] = "Traceback (most recent call last):"
    rows[42] = "RuntimeError: CUDA error: an illegal memory access was encountered"
    (tmp_path / "run" / "train.log").write_text("\n".join(rows) + "\n")
    yield Path("run")
    monkeypatch.undo()
    time.tzset()


async def loaded(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, DflashApp)
    await wait_until(pilot, lambda: app.state.step == STEPS - 1)


def test_alert_toast_over_the_dashboard(snap_compare, fixed_place: Path) -> None:  # type: ignore[no-untyped-def]
    async def fail_a_checkpoint(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        status = fixed_place / "status.jsonl"
        last = last_record(status)
        assert last is not None
        line = protocol.encode_line(
            "event", seq=last.seq + 1, run=RUN_ID, t=T0 + 330.0, level="error",
            code="checkpoint_failed", message="checkpoint at step 600 not written: no space "
            "left on the device (0.0 MiB free); step_0000400 is the newest complete one",
        )  # fmt: skip
        with status.open("a") as fh:
            fh.write(line)
        app = pilot.app
        await wait_until(pilot, lambda: bool(app.toasts))  # type: ignore[attr-defined]
        app.request_redraw()  # type: ignore[attr-defined]
        await pilot.pause(0.5)

    app, _ = console_app(fixed_place, clock=lambda: FROZEN)
    assert snap_compare(app, terminal_size=SIZE, run_before=fail_a_checkpoint)


def test_log_screen_filtered(snap_compare, fixed_place: Path) -> None:  # type: ignore[no-untyped-def]
    async def open_log(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        await pilot.press("L")
        screen = pilot.app.screen
        assert isinstance(screen, LogScreen)
        await wait_until(pilot, lambda: len(screen.lines) == 60)
        await pilot.press("slash", "e", "r", "r", "o", "r")
        screen.query_one("#viewer-filter").cursor_blink = False  # type: ignore[attr-defined]
        await pilot.pause(0.3)

    app, _ = console_app(fixed_place, clock=lambda: FROZEN)
    assert snap_compare(app, terminal_size=SIZE, run_before=open_log)
