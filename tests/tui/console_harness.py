"""Starts the real console app on a real run directory through a LocalTransport that runs the
real `dflash-train` commands and records every argv it was given, so tests can count what
reached the box."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Button

from dflash_train.control.logs import last_lines
from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.sources.transport import CommandResult, LocalTransport
from tests.tui.synthetic_stream import write_stream

MUTATING = frozenset({"launch", "stop", "restart", "set"})
PYTHON = sys.executable
TRAINER = (PYTHON, "-m", "dflash_train")
VALID_FORM = {
    "target_model": "smollm2",
    "target_gpus": "cpu",
    "drafter_gpus": "cpu",
    "pipeline": "async",
    "epochs": "2",
    "lr": "6e-4",
    "hs_queue_depth": "8",
    "hs_min_ready": "2",
    "max_steps": "",
    "extra": "--draft-layers 1",
}


class RecordingTransport(LocalTransport):
    def __init__(self) -> None:
        super().__init__()
        self.commands: list[list[str]] = []

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.commands.append(list(argv))
        return await super().run(argv, timeout=timeout)

    def stream(self, argv: Sequence[str]):  # type: ignore[no-untyped-def]
        self.commands.append(list(argv))
        return super().stream(argv)

    def subcommands(self) -> list[str]:
        """The dflash-train subcommand of each recorded argv, in order."""
        return [
            argv[len(TRAINER)] for argv in self.commands if tuple(argv[: len(TRAINER)]) == TRAINER
        ]

    def mutating(self) -> list[list[str]]:
        return [argv for argv in self.commands if set(argv[len(TRAINER) :][:1]) & MUTATING]


def make_run_dir(root: Path, steps: int = 300) -> Path:
    run_dir = root / "run"
    write_stream(run_dir, steps)
    return run_dir


def live_clock(run_dir: Path) -> Callable[[], float]:
    """time.time, moved so that the console attaches a second after the last line of
    `run_dir`'s stream and runs on in real time from there: the synthetic streams carry
    2026-01-01 times, and a run silent for longer than a minute before the attach is one the
    console asks the box about (whose missing trainer then reads as a crash). Plain
    time.time where there is no stream yet."""
    stream = run_dir / "status.jsonl"
    if not stream.is_file():
        return time.time
    tail, _ = last_lines(stream, 1, max_bytes=1 << 20)
    if not tail:
        return time.time
    shift = time.time() - (json.loads(tail[0])["t"] + 1.0)
    return lambda: time.time() - shift


def console_app(
    run_dir: Path,
    *,
    read_only: bool = False,
    defaults: Mapping[str, str] | None = None,
    remember: Callable[[str, object], None] | None = None,
    clock: Callable[[], float] | None = None,
    theme: str | None = None,
) -> tuple[DflashApp, RecordingTransport]:
    """The app on `run_dir` (its clock a live_clock unless one is given)."""
    if clock is None:
        clock = live_clock(run_dir)
    transport = RecordingTransport()
    options = ConsoleOptions(
        target_name="test-box",
        run_dir=str(run_dir),
        read_only=read_only,
        python=PYTHON,
        launch_defaults=dict(defaults if defaults is not None else VALID_FORM),
        theme=theme,
        remember=remember,
        follow_gpus=False,
    )
    return DflashApp(transport, options, clock=clock), transport


async def wait_until(
    pilot: Pilot[None], predicate: Callable[[], bool], *, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.05)


async def wait_for_controls(pilot: Pilot[None], answered: int = 1) -> None:
    """Wait until the app has handled `answered` control replies in all (refusals too).

    A count, not "the control workers running now": a command's worker can start a few
    turns after the key or button that sent it, and waiting on the workers that exist at
    the call then returns before the command was even sent."""
    app = pilot.app
    assert isinstance(app, DflashApp)
    await wait_until(pilot, lambda: app.controls_answered >= answered)
    await pilot.pause()  # let what the reply pushed (a dialog, a toast) compose


@contextlib.asynccontextmanager
async def attached(
    run_dir: Path, *, steps: int = 300, size: tuple[int, int] = (160, 48), **kwargs: object
) -> AsyncIterator[tuple[DflashApp, Pilot[None], RecordingTransport]]:
    """The console running and showing the whole synthetic stream."""
    app, transport = console_app(run_dir, **kwargs)  # type: ignore[arg-type]
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.state.step == steps - 1)
        app.request_redraw()
        await pilot.pause()
        yield app, pilot, transport


async def press_button(pilot: Pilot[None], selector: str) -> None:
    """Press a dialog's button once the dialog is composed (a mouse click can miss a
    button whose layout is not settled yet on a loaded machine)."""
    await wait_until(pilot, lambda: bool(pilot.app.screen.query(selector)))
    pilot.app.screen.query_one(selector, Button).press()
    await pilot.pause()
