"""Every dialog field refuses bad input with a clear message under the field, and nothing
reaches the box until the input is valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input, Static

from dflash_tui.screens.confirm import ConfirmDialog
from dflash_tui.screens.launch_form import LaunchForm
from dflash_tui.screens.min_ready_prompt import MinReadyPrompt
from dflash_tui.screens.restart_dialog import RestartDialog, parse_overrides
from dflash_tui.sources.launch_fields import LAUNCH_FIELDS, train_args, validate_form
from tests.tui.console_harness import (
    TRAINER,
    VALID_FORM,
    attached,
    make_run_dir,
    press_button,
    wait_for_controls,
    wait_until,
)

# field -> (bad text, words the message under it must contain)
BAD_INPUT: dict[str, tuple[str, str]] = {
    "target_model": ("   ", "required"),
    "data_dir": ("", "required"),
    "target_gpus": ("gpu0", "expected 'cpu' or GPU indices"),
    "drafter_gpus": ("1,1", "listed twice"),
    "pipeline": ("fast", "expected 'sync' or 'async'"),
    "epochs": ("0", "out of range 1.."),
    "lr": ("fast", "expected a number"),
    "hs_queue_depth": ("5000", "out of range 1..4096"),
    "hs_min_ready": ("9", "out of range 1..hs_queue_depth=8"),
    "max_steps": ("-3", "out of range"),
    "extra": ("--seed 'unclosed", "cannot split"),
}


def test_every_field_has_a_bad_input_case() -> None:
    assert set(BAD_INPUT) == {f.name for f in LAUNCH_FIELDS}


def test_valid_form_becomes_train_flags(tmp_path: Path) -> None:
    values, errors = validate_form({**VALID_FORM, "data_dir": str(tmp_path)})
    assert errors == {}
    argv = train_args(values)
    assert argv[:2] == ["--target-model", "smollm2"]
    assert ["--data-dir", str(tmp_path)] == argv[2:4]
    assert "--max-steps" not in argv  # blank optional field left out
    assert argv[-2:] == ["--draft-layers", "1"]


def test_shared_gpu_between_roles_is_refused() -> None:
    _, errors = validate_form(
        {**VALID_FORM, "data_dir": "d", "target_gpus": "0,1", "drafter_gpus": "1"}
    )
    assert errors == {"drafter_gpus": "GPU 1 is also a target GPU"}


async def test_launch_form_refuses_each_bad_field_and_sends_nothing(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    defaults = {**VALID_FORM, "data_dir": str(tmp_path / "data")}
    async with attached(run_dir, defaults=defaults) as (app, pilot, transport):
        sent_before = list(transport.commands)
        await pilot.press("l")
        form = app.screen
        assert isinstance(form, LaunchForm)
        # typing goes into the first field at once (seen in tmux: it went nowhere)
        await pilot.press("x")
        assert form.query_one("#field-target_model", Input).value.endswith("x")
        form.query_one("#field-target_model", Input).value = defaults["target_model"]
        for name, (bad, message) in BAD_INPUT.items():
            field = form.query_one(f"#field-{name}", Input)
            good = field.value
            field.value = bad
            await pilot.pause()
            await press_button(pilot, "#submit")
            await pilot.pause()
            assert app.screen is form, f"{name}: the form closed on bad input"
            error = form.query_one(f"#error-{name}", Static)
            assert error.has_class("shown"), name
            assert message in str(error.render()), (name, str(error.render()))
            assert field.has_class("invalid")
            field.value = good
            await pilot.pause()
            assert not error.has_class("shown"), f"{name}: message stayed after fixing"
        # Nothing from the form. The app's own `status` query of a quiet run (the
        # trainer-gone check, on its timer) may come meanwhile on a slow machine, as it
        # did in a clean-clone CI: it is not the form's.
        assert _not_status(transport.commands) == _not_status(sent_before)
        await pilot.press("escape")
        assert not isinstance(app.screen, LaunchForm)
        assert _not_status(transport.commands) == _not_status(sent_before)


def _not_status(commands: list[list[str]]) -> list[list[str]]:
    return [argv for argv in commands if argv[3:4] != ["status"]]


async def test_launch_form_comes_back_as_it_was_left(tmp_path: Path) -> None:
    """Seen in tmux: cancelling the "Launch this run?" confirmation threw away a whole form
    of typing; reopening showed the profile's defaults again."""
    run_dir = make_run_dir(tmp_path)
    defaults = {**VALID_FORM, "data_dir": str(tmp_path / "data")}
    async with attached(run_dir, defaults=defaults) as (app, pilot, transport):
        sent_before = list(transport.commands)
        await pilot.press("l")
        form = app.screen
        assert isinstance(form, LaunchForm)
        form.query_one("#field-max_steps", Input).value = "300"
        form.query_one("#field-extra", Input).value = "--block-size 4"
        await press_button(pilot, "#submit")
        await pilot.press("n")  # cancel the confirmation (Enter would launch)
        assert not isinstance(app.screen, LaunchForm)
        await pilot.press("l")
        again = app.screen
        assert isinstance(again, LaunchForm) and again is not form
        assert again.query_one("#field-max_steps", Input).value == "300"
        assert again.query_one("#field-extra", Input).value == "--block-size 4"
        assert again.query_one("#field-data_dir", Input).value == defaults["data_dir"]
        await pilot.press("escape")
        assert transport.commands == sent_before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hs_min_ready", "is not key=value"),
        ("hs_min_ready=", "is not key=value"),
        ("colour=blue", "unknown setting"),
        ("hs_min_ready=abc", "expected an integer"),
        ("hs_min_ready=99", "out of range 1..hs_queue_depth=8"),
        ("hs_min_ready=2 hs_min_ready=3", "given twice"),
        ("hs_queue_depth=2", "below hs_min_ready=3"),
        ("'open", "cannot split"),
    ],
)
def test_restart_overrides_are_checked_with_protocol_rules(text: str, message: str) -> None:
    from dflash_train.protocol import SettingError

    with pytest.raises(SettingError, match=message):
        parse_overrides(text, {"hs_queue_depth": 8, "hs_min_ready": 3})


async def test_restart_and_min_ready_dialogs_refuse_bad_input(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    async with attached(run_dir) as (app, pilot, transport):
        sent_before = list(transport.commands)

        await pilot.press("R")
        assert isinstance(app.screen, RestartDialog)
        overrides = app.screen.query_one("#overrides", Input)
        for bad in ("hs_min_ready=0", "junk", "hs_min_ready=x"):
            overrides.value = bad
            await press_button(pilot, "#submit")
            await pilot.pause()
            assert isinstance(app.screen, RestartDialog)
            assert app.screen.query_one("#overrides-error", Static).has_class("shown")
        await pilot.press("escape")

        await pilot.press("m")
        prompt = app.screen
        assert isinstance(prompt, MinReadyPrompt)
        # The value in force (3, from the stream) and the range (1..8) are shown.
        body = " ".join(str(s.render()) for s in prompt.query(".dialog-body").results(Static))
        assert "now 3" in body and "1..8" in body
        # No profile here: the dialog says what happens, and names no profile.
        assert "a restart of this run keeps it" in body and "profile" not in body
        value = prompt.query_one("#value", Input)
        for bad, message in (("0", "out of range"), ("9", "1..hs_queue_depth=8"), ("x", "integer")):
            value.value = bad
            await press_button(pilot, "#submit")
            await pilot.pause()
            assert app.screen is prompt
            assert message in str(prompt.query_one("#value-error", Static).render())
        await pilot.press("escape")
        assert transport.commands == sent_before


async def test_enter_on_the_launch_confirmation_launches_and_on_stop_cancels(
    tmp_path: Path,
) -> None:
    run_dir = make_run_dir(tmp_path)
    # A data dir that does not exist: the box's preflight refuses, no trainer starts.
    defaults = {**VALID_FORM, "data_dir": str(tmp_path / "no-data")}
    async with attached(run_dir, defaults=defaults) as (app, pilot, transport):
        await pilot.press("S")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "n, Esc or Enter: Cancel" in str(app.screen.query_one(".dialog-hint").render())
        await pilot.press("enter")  # a stray Enter never stops a run
        assert not isinstance(app.screen, ConfirmDialog) and transport.mutating() == []

        await pilot.press("l")
        await press_button(pilot, "#submit")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "y or Enter: Launch" in str(app.screen.query_one(".dialog-hint").render())
        await pilot.press("enter")
        await wait_for_controls(pilot)
        assert [argv[len(TRAINER)] for argv in transport.mutating()] == ["launch"]
        assert app.replies[-1].command == "launch" and not app.replies[-1].ok
        assert "no-data" in (app.replies[-1].error or "")
