"""The console `dflash-tui serve` starts for each browser: read-only by the Session's own
latch even when the UI below it would allow control (a confirmed launch is refused before
anything reaches the box), the CLI shows it as watch mode, and serve's arguments fail with
one line before anything listens."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Input

from dflash_tui import cli_args
from dflash_tui.sources.session import WATCH_ONLY_ENV, ReadOnlyError
from tests.tui.console_harness import (
    attached,
    make_run_dir,
    press_button,
    wait_for_controls,
    wait_until,
)


async def test_the_session_latch_refuses_what_the_ui_lets_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WATCH_ONLY_ENV, "1")
    run_dir = make_run_dir(tmp_path)
    # A console built as for control: only the Session's latch stands in the way.
    async with attached(run_dir, read_only=False) as (app, pilot, transport):
        assert not app.options.read_only and app.session.read_only
        await pilot.press("m")  # the UI lets the prompt open and the value through
        await wait_until(pilot, lambda: bool(app.screen.query("#value")))
        app.screen.query_one("#value", Input).value = "2"
        await press_button(pilot, "#submit")
        # The refusal is the control worker's answer, which may come turns after the button.
        await wait_for_controls(pilot)
        assert any("refused" in n.text and "watch mode" in n.text for n in app.notes)
        with pytest.raises(ReadOnlyError):
            await app.session.stop()
        with pytest.raises(ReadOnlyError):
            await app.session.launch(["--epochs", "1"])
    assert transport.mutating() == []
    assert "tail" in transport.subcommands()


def test_the_cli_shows_a_served_console_as_watch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli_args.build_parser().parse_args(["local", "--run-dir", "/tmp/r"])
    assert not cli_args.choose_profile(args, []).watch
    monkeypatch.setenv(WATCH_ONLY_ENV, "1")
    assert cli_args.choose_profile(args, []).watch


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "70000", "local"], "--port: 70000 is not in 1..65535"),
        (["--port", "8123", "box", "--container", "abc"], "--container: expected a numeric"),
        (["--container", "abc", "--port", "8123", "box"], "--container: expected a numeric"),
        (["--port", "8123", "demo"], "serve: the demo launches a run"),
        (["--port", "8123"], "serve: give a destination"),
    ],
)
def test_serve_refuses_bad_arguments_before_listening(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"  # profiles, no default: no destination means the fleet
    config.write_text('[profiles.one]\nrun_dir = "/r"\n')
    done = subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", "serve", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "DFLASH_CONFIG": str(config)},
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert isinstance(cli_args.build_parser(), argparse.ArgumentParser)
