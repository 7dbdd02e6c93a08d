"""Watch mode: the mutating keys are hidden and refused by the screen, and the Session
refuses the calls anyway; pressing every key sends no mutating command to the box."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_tui.keymap import KEYMAP, MUTATING_ACTIONS
from dflash_tui.screens.checkpoints_screen import CheckpointsScreen
from dflash_tui.screens.help import HelpScreen
from dflash_tui.screens.line_viewer import LineViewer
from dflash_tui.screens.main import MainScreen
from dflash_tui.screens.run_details import RunDetailsScreen
from dflash_tui.sources.session import ReadOnlyError
from dflash_tui.widgets.header import RunHeader
from tests.tui.console_harness import attached, make_run_dir, wait_for_controls

VIEWS = (HelpScreen, LineViewer, RunDetailsScreen, CheckpointsScreen)


async def test_every_key_in_watch_mode_sends_nothing_mutating(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path), read_only=True) as (app, pilot, transport):
        main = app.screen
        assert isinstance(main, MainScreen)
        assert "READ-ONLY" in str(main.query_one(RunHeader).render())
        shown = {b.binding.action for b in main.active_bindings.values() if b.enabled}
        assert not shown & MUTATING_ACTIONS
        for entry in KEYMAP:
            if entry.action == "app.quit":
                continue
            await pilot.press(entry.key)
            await pilot.pause()
            if isinstance(app.screen, VIEWS):  # views, not actions
                await pilot.press("escape")
                await pilot.pause()
            assert app.screen is main, f"{entry.key}: opened {app.screen!r} in watch mode"
        # Bypassing the screen: the app's own senders go through the read-only Session.
        app.send_stop()
        app.send_min_ready(4)
        await wait_for_controls(pilot, 2)
        await pilot.pause()
        assert sum("watch mode" in n.text for n in app.notes) == 2
        with pytest.raises(ReadOnlyError):
            await app.session.launch(["--epochs", "1"])
        titles = {c.title for c in app.get_system_commands(main)}
        assert not titles & {"Launch", "Restart", "Stop", "Min-ready"}
        assert "Pause" in titles
    assert transport.mutating() == []
    # L reads train.log, c asks `status` for the checkpoints: neither mutates.
    assert transport.subcommands() == ["tail", "logs", "status"]
