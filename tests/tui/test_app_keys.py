"""Every key path of the console, driven by Pilot against a real run directory through the
real `dflash-train` commands."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Input, RadioButton, Static

from dflash_train import protocol
from dflash_tui.keymap import KEYMAP, PANES
from dflash_tui.keymap import remaps as keymap_remaps
from dflash_tui.screens.confirm import ConfirmDialog
from dflash_tui.screens.help import HelpScreen, keys_table
from dflash_tui.screens.launch_form import LaunchForm
from dflash_tui.screens.main import PANE_IDS
from dflash_tui.screens.min_ready_prompt import MinReadyPrompt
from dflash_tui.screens.reply import ReplyDialog
from dflash_tui.screens.restart_dialog import RestartDialog
from dflash_tui.sources.console_options import remember_in
from dflash_tui.sources.profiles import Profile, load_config
from dflash_tui.widgets.header import RunHeader
from dflash_tui.widgets.loss_plot import LossPane
from tests.tui.console_harness import (
    TRAINER,
    attached,
    make_run_dir,
    press_button,
    wait_for_controls,
    wait_until,
)
from tests.tui.synthetic_stream import RUN_ID


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("DFLASH_CONFIG", str(path))
    return path


def header_text(app) -> str:  # type: ignore[no-untyped-def]
    return str(app.screen.query_one(RunHeader).render())


async def test_attach_draws_every_pane(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await wait_until(pilot, lambda: "step 299/" in header_text(app))
        header = header_text(app)
        assert RUN_ID in header and "RUNNING" in header and "epoch 6/6" in header
        assert "last update" in header
        assert transport.subcommands()[:1] == ["tail"], transport.commands
        assert transport.mutating() == []


async def test_attaching_to_a_run_silent_since_before_shows_its_crash_at_once(
    tmp_path: Path,
) -> None:
    """The stream ends without run_end, its last line is months old (the box's clock) and
    no trainer holds the run: the box's `status` is asked as the history ends, not after a
    minute of silence counted from the attach, and says crashed."""
    import time

    async with attached(make_run_dir(tmp_path), clock=time.time) as (app, pilot, transport):
        await wait_until(pilot, lambda: "CRASHED" in header_text(app), timeout=20)
        assert transport.subcommands()[:2] == ["tail", "status"], transport.commands
        assert transport.mutating() == []


async def test_launch_confirm_then_shows_the_failure_reason(tmp_path: Path) -> None:
    # The data dir does not exist: the box's preflight refuses, and says why.
    missing = tmp_path / "no-such-data"
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("l")
        form = app.screen
        assert isinstance(form, LaunchForm)
        form.query_one("#field-data_dir", Input).value = str(missing)
        await press_button(pilot, "#submit")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        assert transport.mutating() == []  # nothing before the confirmation
        await press_button(pilot, "#yes")
        await wait_for_controls(pilot)
        await pilot.pause()
        launches = transport.mutating()
        assert len(launches) == 1
        words = launches[0][len(TRAINER) :]
        assert words[:2] == ["launch", str(app.run_dir)]
        train = words[words.index("--") + 1 :]
        assert train[train.index("--data-dir") + 1] == str(missing)
        dialog = app.screen
        assert isinstance(dialog, ReplyDialog)
        assert not dialog.reply.ok
        assert dialog.reply.error and dialog.reply.error_code
        title = str(dialog.query_one(".dialog-title", Static).render())
        assert "launch failed" in title and dialog.reply.error in title


async def test_launch_cancelled_at_confirmation_sends_nothing(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("l")
        app.screen.query_one("#field-data_dir", Input).value = str(tmp_path)
        await press_button(pilot, "#submit")
        await pilot.pause()
        await press_button(pilot, "#no")
        await pilot.pause()
        assert not isinstance(app.screen, (ConfirmDialog, LaunchForm))
        assert transport.mutating() == []


async def test_stop_confirm_then_shows_the_result(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("S")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog)
        assert RUN_ID in dialog.body  # the dialog names the run
        await pilot.press("escape")
        assert transport.mutating() == []
        await pilot.press("S")
        await press_button(pilot, "#yes")
        await wait_for_controls(pilot)
        await pilot.pause()
        assert [argv[len(TRAINER)] for argv in transport.mutating()] == ["stop"]
        assert isinstance(app.screen, ReplyDialog)
        assert app.screen.reply.command == "stop"
        await pilot.press("escape")
        assert not isinstance(app.screen, ReplyDialog)


async def test_restart_resume_with_override_sends_it(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("R")
        dialog = app.screen
        assert isinstance(dialog, RestartDialog)
        assert RUN_ID in dialog.run_name
        dialog.query_one("#overrides", Input).value = "hs_min_ready=4"
        app.screen.query_one("#fresh", RadioButton).value = True
        dialog.query_one("#fresh-confirm", Input).value = "fresh"  # the typed confirmation
        await press_button(pilot, "#submit")
        await wait_for_controls(pilot)
        await pilot.pause()
        (argv,) = transport.mutating()
        words = argv[len(TRAINER) :]
        assert words[:3] == ["restart", str(app.run_dir), "--fresh"]
        assert words[-2:] == ["--hs-min-ready", "4"]
        assert isinstance(app.screen, ReplyDialog)
        assert app.screen.reply.command == "restart"


async def test_min_ready_is_sent_and_remembered_in_the_profile(
    tmp_path: Path, config_file: Path
) -> None:
    async with attached(make_run_dir(tmp_path), remember=remember_in(Profile("box"))) as (
        app,
        pilot,
        transport,
    ):
        await pilot.press("m")
        prompt = app.screen
        assert isinstance(prompt, MinReadyPrompt)
        prompt.query_one("#value", Input).value = "5"
        await pilot.press("enter")
        await wait_for_controls(pilot)
        await pilot.pause()
        (argv,) = transport.mutating()
        assert argv[len(TRAINER) :] == ["set", str(app.run_dir), "hs_min_ready", "5"]
        # No trainer holds this run dir: the box refuses, and the refusal is shown.
        refusal = "set failed: run_dir: no trainer holds"
        assert any(n.text.startswith(refusal) for n in app.notes)  # one human line
        assert isinstance(app.screen, ReplyDialog)
        assert app.screen.reply.error_code == "not_running"
        await pilot.press("escape")
        # A restart offers no override: the box keeps a live-set value by itself.
        await pilot.press("R")
        assert app.screen.query_one("#overrides", Input).value == ""
        await pilot.press("escape")
    assert load_config(config_file).profiles["box"].launch.hs_min_ready == 5


async def test_number_keys_toggle_panes(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, _):
        for index, (name, _title) in enumerate(PANES, start=1):
            pane = app.screen.query_one(f"#{PANE_IDS[name]}")
            assert pane.display
            await pilot.press(str(index))
            assert not pane.display
            await pilot.press(str(index))
            assert pane.display


async def test_theme_key_cycles_and_is_remembered(tmp_path: Path, config_file: Path) -> None:
    async with attached(make_run_dir(tmp_path), remember=remember_in(Profile("box"))) as (
        app,
        pilot,
        _,
    ):
        assert app.theme == "dflash-dark"
        seen = [app.theme]
        for _ in app.theme_names:
            await pilot.press("t")
            seen.append(app.theme)
        assert set(seen) == {"dflash-dark", "dflash-light", "dflash-high-contrast"}
        assert seen[-1] == "dflash-dark"
        await pilot.press("t")
        chosen = app.theme
    assert load_config(config_file).profiles["box"].theme == chosen


COMMENTED = """# my boxes
default_profile = "box"  # the one I use

[profiles.box]
# the trainer box in the rack
run_dir = "/data/runs/r1"   # aligned by hand
theme = "dflash-dark"
launch = { epochs = 6, hs_min_ready = 30 }  # inline, kept inline
"""


async def test_theme_key_keeps_a_commented_config_byte_for_byte(
    tmp_path: Path, config_file: Path
) -> None:
    config_file.write_text(COMMENTED)
    async with attached(make_run_dir(tmp_path), remember=remember_in(Profile("box"))) as (
        app,
        pilot,
        _,
    ):
        await pilot.press("t")
        chosen = app.theme
        assert chosen != "dflash-dark"
        await pilot.press("m")
        app.screen.query_one("#value", Input).value = "7"
        await pilot.press("enter")
        await wait_until(pilot, lambda: "hs_min_ready = 7" in config_file.read_text())
    expected = COMMENTED.replace('theme = "dflash-dark"', f'theme = "{chosen}"').replace(
        "hs_min_ready = 30", "hs_min_ready = 7"
    )
    assert config_file.read_text() == expected


async def test_keys_table_remaps_a_binding_and_the_help_screen_says_so(
    tmp_path: Path, config_file: Path
) -> None:
    config_file.write_text('[keys]\ntheme = "ctrl+t"\n')
    async with attached(make_run_dir(tmp_path)) as (app, pilot, _):
        assert app.remapped_keys == {"dflash.theme": "ctrl+t"}
        await pilot.press("t")  # the old key does nothing now
        assert app.theme == "dflash-dark"
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.theme != "dflash-dark")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        console = Console(file=io.StringIO(), width=200)
        console.print(keys_table(read_only=False, remapped=app.screen.remapped))
        lines = console.file.getvalue().splitlines()
        (theme,) = [line for line in lines if "next colour theme" in line]
        assert theme.split()[0] == "ctrl+t" and "(remapped in [keys]: was t)" in theme
        assert not any("remapped" in line for line in lines if line is not theme)


def test_remaps_name_an_unknown_id_or_a_key_taken() -> None:
    assert keymap_remaps({"dflash.stop": "ctrl+s", "theme": "T,ctrl+t"}) == {
        "dflash.stop": "ctrl+s",
        "dflash.theme": "T,ctrl+t",
    }
    with pytest.raises(ValueError, match=r"keys.stopp: not a key of the console \(known: launch"):
        keymap_remaps({"stopp": "x"})
    with pytest.raises(ValueError, match=r"keys.stop: 'q' is already quit's key"):
        keymap_remaps({"stop": "q"})
    assert keymap_remaps({"stop": "q", "quit": "ctrl+q"})  # quit moved away first


async def test_theme_flag_and_palette_entries(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    async with attached(run_dir, theme="dflash-high-contrast") as (app, _pilot, _):
        assert app.theme == "dflash-high-contrast"
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Theme: dflash-light", "Launch", "Stop", "Restart", "Min-ready"} <= set(titles)


async def test_pause_freezes_the_panes_but_not_the_state(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    async with attached(run_dir) as (app, pilot, _):
        loss = app.screen.query_one(LossPane)
        before = str(loss.query_one(".pane-summary", Static).render())
        await pilot.press("p")
        assert "PAUSED" in header_text(app)
        with (run_dir / "status.jsonl").open("a") as fh:
            fh.write(
                protocol.encode_line(
                    "step", seq=10_000, run=RUN_ID, step=300, epoch=6, epoch_progress=1.0,
                    loss=0.123, acc=0.9, tau=5.0, lr=6e-4, grad_norm=0.5, tokens=1,
                    ktok_s=100.0,
                )
            )  # fmt: skip
        await wait_until(pilot, lambda: app.state.step == 300)
        await pilot.pause(0.6)
        assert str(loss.query_one(".pane-summary", Static).render()) == before
        await pilot.press("p")
        await wait_until(
            pilot, lambda: "0.123" in str(loss.query_one(".pane-summary", Static).render())
        )


async def test_loss_log_scale_and_smoothing_toggles(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, _):
        loss = app.screen.query_one(LossPane)
        await pilot.press("g")
        await pilot.press("s")
        assert loss.log_scale and loss.smoothing
        summary = loss.query_one(".pane-summary", Static)
        await wait_until(pilot, lambda: "(log, smooth)" in str(summary.render()))


async def test_help_lists_every_key(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, _):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(keys_table(read_only=False))
        rendered = console.export_text()
        for entry in KEYMAP:
            assert entry.help in rendered
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
    assert all(entry.help for entry in KEYMAP)


async def test_quit_exits_without_touching_the_run(tmp_path: Path) -> None:
    async with attached(make_run_dir(tmp_path)) as (app, pilot, transport):
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0  # the app is leaving, normally
    assert transport.mutating() == []
    assert transport.subcommands() == ["tail"]
