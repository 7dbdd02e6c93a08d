"""SVG snapshots of the main screen, in control and in watch mode, and of the launch form
refusing a field. Deterministic: a fixed status stream, a frozen clock, UTC times and a
relative run directory."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from dflash_tui.app import DflashApp
from tests.tui.console_harness import console_app, press_button, wait_until
from tests.tui.synthetic_stream import T0, write_stream

STEPS = 3000
SIZE = (160, 48)
# Ten seconds after the stream's last line (T0 + 1,530 s): a live run, as a console sees one
# while its trainer writes (a run silent for longer makes the console ask the box).
FROZEN = T0 + 1_540.0


@pytest.fixture
def fixed_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    write_stream(tmp_path / "run", STEPS)
    yield Path("run")
    monkeypatch.undo()
    time.tzset()


def attached_app(run_dir: Path, *, read_only: bool) -> DflashApp:
    app, _ = console_app(run_dir, read_only=read_only, clock=lambda: FROZEN)
    return app


async def loaded(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, DflashApp)
    await wait_until(pilot, lambda: app.state.step == STEPS - 1)
    app.request_redraw()
    await pilot.pause(0.3)


def test_main_screen_in_control_mode(snap_compare, fixed_place: Path) -> None:  # type: ignore[no-untyped-def]
    app = attached_app(fixed_place, read_only=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_main_screen_in_watch_mode(snap_compare, fixed_place: Path) -> None:  # type: ignore[no-untyped-def]
    app = attached_app(fixed_place, read_only=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_launch_form_with_a_refused_field(snap_compare, fixed_place: Path) -> None:  # type: ignore[no-untyped-def]
    async def refuse_lr(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        await pilot.press("l")
        for field in pilot.app.screen.query(Input).results(Input):
            field.cursor_blink = False  # a blinking cursor would make the image flaky
        pilot.app.screen.query_one("#field-lr", Input).value = "fast"
        await press_button(pilot, "#submit")
        await pilot.pause(0.3)

    app = attached_app(fixed_place, read_only=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=refuse_lr)


LONG_STEPS = 20_000


def test_main_screen_with_a_long_run(  # type: ignore[no-untyped-def]
    snap_compare, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20,000 steps (2 h 47 min at 0.5 s a step) arrive as the box's summary: every plot
    # and the GPU history span step 0 to now, with a line at each checkpoint.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    write_stream(tmp_path / "run", LONG_STEPS)

    async def long_loaded(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, DflashApp)
        await wait_until(pilot, lambda: app.state.step == LONG_STEPS - 1)
        app.request_redraw()
        await pilot.pause(0.3)

    app, _ = console_app(Path("run"), clock=lambda: T0 + 10_040.0)  # last line + 10 s
    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=long_loaded)
    finally:
        monkeypatch.undo()
        time.tzset()
