"""The whole operator loop on a real CPU training run (a tiny random target, real
`dflash-train` commands): launch from the form, watch steps arrive, change hs_min_ready live
and see the trainer's ack, stop, and see the run end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from textual.widgets import Input

from dflash_tui.screens.reply import ReplyDialog
from dflash_tui.sources.backoff import Backoff
from dflash_tui.widgets.header import RunHeader
from tests.tui.console_harness import console_app, press_button, wait_for_controls, wait_until

TINY_TRAIN = {
    "target_model": "random:tiny",
    "target_gpus": "cpu",
    "drafter_gpus": "cpu",
    "pipeline": "sync",
    "epochs": "200",
    "lr": "6e-4",
    "hs_queue_depth": "4",
    "hs_min_ready": "2",
    "max_steps": "",
    "extra": "--draft-layers 1 --max-length 128 --block-size 4 --num-anchors 4 "
    "--tokens-per-batch 256 --save-every 0",
}


async def test_launch_set_and_stop_a_real_run(tmp_path: Path, tiny_data: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    app, transport = console_app(run_dir, defaults={**TINY_TRAIN, "data_dir": str(tiny_data)})
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            header = app.screen.query_one(RunHeader)
            await pilot.press("l")
            await press_button(pilot, "#submit")
            await press_button(pilot, "#yes")
            await wait_until(pilot, lambda: bool(app.replies), timeout=240)
            reply = app.replies[-1]
            assert reply.ok, (reply.error, reply.data.get("log_tail"))
            # A success is one human line in a toast and in events; no modal over the run.
            assert not isinstance(app.screen, ReplyDialog)
            line = (
                f"launched: training in {reply.data['seconds']:.1f} s, run {reply.data['run_id']}"
            )
            assert any(n.text.startswith(line) for n in app.notes)
            assert any(message.startswith(line) for _, message in app.toasts)
            await wait_until(pilot, lambda: (app.state.step or 0) >= 2, timeout=120)
            await wait_until(pilot, lambda: "RUNNING" in str(header.render()))

            await pilot.press("m")
            app.screen.query_one("#value", Input).value = "1"
            await pilot.press("enter")
            await wait_for_controls(pilot, 2)
            codes = lambda: [e.code for e in app.state.events]  # noqa: E731
            await wait_until(pilot, lambda: "control_applied" in codes(), timeout=60)
            assert app.state.settings["hs_min_ready"] == 1

            await pilot.press("S")
            await press_button(pilot, "#yes")
            await wait_until(pilot, lambda: app.replies[-1].command == "stop", timeout=120)
            assert app.replies[-1].ok and not isinstance(app.screen, ReplyDialog)
            assert any(n.text.startswith("stopped: run ") for n in app.notes)
            await wait_until(pilot, lambda: app.state.end is not None, timeout=60)
            assert app.state.end["reason"] == "signal"
            await wait_until(pilot, lambda: "STOPPED" in str(header.render()))
    finally:
        # Never leave a trainer behind, whatever failed above.
        subprocess.run(
            [sys.executable, "-m", "dflash_train", "stop", str(run_dir), "--timeout", "30"],
            capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    subcommands = transport.subcommands()
    assert [c for c in subcommands if c in ("launch", "set", "stop")] == ["launch", "set", "stop"]


async def test_a_launch_into_a_new_run_dir_is_followed_at_once(
    tmp_path: Path, tiny_data: Path
) -> None:
    """Seen in tmux: with no run dir yet the stream waits out its reconnect backoff, so the
    launched run's lines appeared only up to 30 s later. Here the backoff is an hour: the
    steps can only arrive because a successful launch restarts the follow."""
    run_dir = tmp_path / "new-run"  # does not exist: `tail` fails until launch makes it
    app, transport = console_app(run_dir, defaults={**TINY_TRAIN, "data_dir": str(tiny_data)})
    app.session.backoff = Backoff(initial=3600.0, cap=3600.0, jitter=0.0)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            # No reconnect loop: the console says there is no run and waits for a launch.
            await wait_until(pilot, lambda: app.connection == "no_run", timeout=60)
            assert "NO RUN" in str(app.screen.query_one(RunHeader).render())
            hint = f"no run in {run_dir} yet — press l to launch"
            assert any(n.text == hint for n in app.notes)
            tails = transport.subcommands().count("tail")
            await pilot.pause(1.0)
            assert transport.subcommands().count("tail") == tails  # nothing retried meanwhile
            await pilot.press("l")
            await press_button(pilot, "#submit")
            await press_button(pilot, "#yes")
            await wait_until(pilot, lambda: bool(app.replies), timeout=240)
            assert app.replies[-1].ok, app.replies[-1].error
            await wait_until(pilot, lambda: (app.state.step or 0) >= 1, timeout=120)
    finally:
        subprocess.run(
            [sys.executable, "-m", "dflash_train", "stop", str(run_dir), "--timeout", "30"],
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
