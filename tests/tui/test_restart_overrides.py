"""The restart dialog takes an override of any train option, checks it with the trainer's
own option table before anything is sent, and sends it as train flags."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, Static

from dflash_tui.screens.reply import ReplyDialog
from dflash_tui.screens.restart_dialog import RestartDialog
from tests.tui.console_harness import (
    TRAINER,
    attached,
    make_run_dir,
    press_button,
    wait_for_controls,
)


async def test_restart_sends_a_general_override_after_checking_it(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("R")
        dialog = app.screen
        assert isinstance(dialog, RestartDialog)
        overrides = dialog.query_one("#overrides", Input)
        error = dialog.query_one("#overrides-error", Static)
        # Refused in the dialog with the trainer's reason; nothing reaches the box.
        for bad, reason in (
            ("epochs=0", "epochs: 0 is out of range 1.."),
            ("lr=fast", "lr: expected a number"),
            ("epoch=8", "epoch: unknown setting"),
            ("run_id=x", "run_id: set by restart itself"),
        ):
            overrides.value = bad
            await press_button(pilot, "#submit")
            await pilot.pause()
            assert app.screen is dialog and error.has_class("shown")
            assert reason in str(error.render()), (bad, str(error.render()))
        assert transport.mutating() == []
        overrides.value = "epochs=8 lr=1e-4 max_steps=200000 hs_min_ready=4"
        await pilot.pause()
        assert not error.has_class("shown")
        await press_button(pilot, "#submit")
        await wait_for_controls(pilot)
        await pilot.pause()
        (argv,) = transport.mutating()
        words = argv[len(TRAINER) :]
        assert words[:2] == ["restart", str(app.run_dir)] and "--fresh" not in words
        flags = words[words.index("--") + 1 :]
        assert flags == [
            "--epochs", "8", "--lr", "1e-4", "--max-steps", "200000", "--hs-min-ready", "4",
        ]  # fmt: skip
        assert isinstance(app.screen, ReplyDialog)
        assert app.screen.reply.command == "restart"
