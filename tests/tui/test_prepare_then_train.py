"""The launch form's "prepare first": one launch prepares the data dir with the real SmolLM2
target, then trains on it (PREPARING, then RUNNING, in the same run); bad prepare flags are
refused under the field; a prepare that fails never starts the training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from textual.widgets import Input, Static

from dflash_train import protocol
from dflash_tui.screens.launch_form import LaunchForm
from dflash_tui.sources.prepare_launch import launch_argv
from dflash_tui.widgets.header import RunHeader
from dflash_tui.widgets.loss_plot import PREPARE_THEN_TRAIN, LossPane
from tests.tui.console_harness import console_app, press_button, wait_until

TRAIN = {
    "target_model": "smollm2",
    "target_gpus": "cpu",
    "drafter_gpus": "cpu",
    "pipeline": "sync",
    "epochs": "1",
    "lr": "6e-4",
    "hs_queue_depth": "4",
    "hs_min_ready": "2",
    "max_steps": "2",
    "extra": "--draft-layers 1 --max-length 128 --block-size 4 --num-anchors 4 "
    "--tokens-per-batch 256 --save-every 0",
}
PREPARE = (
    "--prompts builtin --samples 3 --max-new-tokens 6 --batch-size 3 --devices cpu --heldout 0"
)


def _kinds(run_dir: Path) -> list[tuple[str, str | None]]:
    lines = [json.loads(x) for x in (run_dir / "status.jsonl").read_text().splitlines()]
    return [(line["kind"], line.get("mode")) for line in lines]


async def test_prepare_then_train_is_one_launch(tmp_path: Path) -> None:
    run_dir, data = tmp_path / "run", tmp_path / "data"
    run_dir.mkdir()
    app, transport = console_app(run_dir, defaults={**TRAIN, "data_dir": str(data)})
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            header = app.screen.query_one(RunHeader)
            await pilot.press("l")
            form = app.screen
            assert isinstance(form, LaunchForm)
            field = form.query_one("#field-prepare", Input)
            field.value = "--prompts builtin --samples 0"
            await pilot.pause()
            error = form.query_one("#error-prepare", Static)
            assert "samples" in str(error.render()), str(error.render())
            field.value = PREPARE
            await press_button(pilot, "#submit")
            await press_button(pilot, "#yes")
            await wait_until(pilot, lambda: bool(app.replies), timeout=240)
            reply = app.replies[-1]
            assert reply.ok, (reply.error, reply.data.get("log_tail"))
            launched = transport.mutating()[-1]
            assert launched.index("--prepare") < launched.index("--"), launched
            assert launched.count("--") == 2 and "--samples" in launched
            await wait_until(pilot, lambda: "PREPARING" in str(header.render()), timeout=120)
            # The metrics pane says the training follows, then shows its loss once it does.
            metrics = app.screen.query_one(LossPane).query_one(".pane-summary")
            await wait_until(pilot, lambda: PREPARE_THEN_TRAIN in str(metrics.render()))
            await wait_until(pilot, lambda: app.state.mode == "train", timeout=300)
            await wait_until(pilot, lambda: "loss" in str(metrics.render()), timeout=120)
            await wait_until(pilot, lambda: app.state.end is not None, timeout=300)
            assert app.state.end["reason"] == "completed" and app.state.step == 2
    finally:
        subprocess.run(
            [sys.executable, "-m", "dflash_train", "stop", str(run_dir), "--timeout", "30"],
            capture_output=True,
            timeout=120,
        )
    kinds = _kinds(run_dir)
    assert kinds[0] == ("run_start", "prepare") and ("run_end", "prepare") in kinds
    assert kinds.index(("run_end", "prepare")) < kinds.index(("run_start", None)), kinds
    assert (data / "prepare.json").is_file()


def test_a_failed_prepare_never_starts_training(tmp_path: Path) -> None:
    run_dir, data = tmp_path / "run", tmp_path / "data"
    data.mkdir()
    (data / "keep.txt").write_text("someone's data")  # prepare refuses an occupied --out
    values = {**TRAIN, "data_dir": str(data), "prepare": PREPARE}
    argv = launch_argv(values, ["--target-model", "smollm2", "--target-gpus", "cpu"])
    result = subprocess.run(
        [sys.executable, "-m", "dflash_train", "launch", str(run_dir), *argv],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    reply = protocol.decode_reply(result.stdout)
    assert isinstance(reply, protocol.Reply) and not reply.ok, result.stdout
    assert reply.error_code == "exited_at_startup"
    assert any("already exists" in line for line in reply.data["log_tail"])
    stream = run_dir / "status.jsonl"
    assert not stream.exists() or ("run_start", None) not in _kinds(run_dir)
    assert (data / "keep.txt").read_text() == "someone's data"
