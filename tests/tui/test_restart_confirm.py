"""A fresh restart abandons the run's training state, so the restart dialog sends it only
after the run id or the word "fresh" has been typed (as k9s asks before deleting)."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, RadioButton, Static

from dflash_tui.screens.restart_dialog import RestartDialog
from tests.tui.console_harness import (
    TRAINER,
    attached,
    make_run_dir,
    press_button,
    wait_for_controls,
)
from tests.tui.synthetic_stream import RUN_ID


async def test_fresh_restart_is_sent_only_after_the_typed_confirmation(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("R")
        dialog = app.screen
        assert isinstance(dialog, RestartDialog)
        box = dialog.query_one("#fresh-confirm-box")
        assert not box.has_class("shown")  # resume needs no confirmation
        await pilot.click("#fresh")
        await pilot.pause()
        assert dialog.query_one("#fresh", RadioButton).value
        assert box.has_class("shown")
        hint = " ".join(str(s.render()) for s in box.query(".form-hint").results(Static))
        assert RUN_ID in hint and '"fresh"' in hint
        confirm = dialog.query_one("#fresh-confirm", Input)
        error = dialog.query_one("#fresh-confirm-error", Static)
        # Enter on the old habit (R, fresh, Enter) and a wrong word send nothing.
        for typed in ("", "yes", RUN_ID[:-1], "Fresh"):
            confirm.value = typed
            await press_button(pilot, "#submit")
            await pilot.pause()
            assert app.screen is dialog
            assert error.has_class("shown") and "type" in str(error.render())
            assert transport.mutating() == []
        # The run id confirms, typed into the field and submitted with Enter.
        confirm.value = ""
        confirm.focus()
        await pilot.press(*RUN_ID, "enter")
        await wait_for_controls(pilot)
        await pilot.pause()
        (argv,) = transport.mutating()
        assert argv[len(TRAINER) :][:3] == ["restart", str(app.run_dir), "--fresh"]


async def test_switching_back_to_resume_needs_no_confirmation(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("R")
        dialog = app.screen
        assert isinstance(dialog, RestartDialog)
        await pilot.click("#fresh")
        await pilot.pause()
        await pilot.click("#resume")
        await pilot.pause()
        assert not dialog.query_one("#fresh-confirm-box").has_class("shown")
        await press_button(pilot, "#submit")
        await wait_for_controls(pilot)
        await pilot.pause()
        (argv,) = transport.mutating()
        assert "--fresh" not in argv and argv[len(TRAINER)] == "restart"
