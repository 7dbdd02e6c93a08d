"""The trainer's split advice as the console offers it: read from the monitor's own event
(the real SplitAdvisor), current only since the latest run_start, turned into restart
overrides on the run's own GPUs that the restart dialog's check and the box's
`dflash-train restart --set` both take; the console shows it and its key (`a`) opens the
restart dialog with them filled in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from dflash_train import protocol
from dflash_train.pipeline.split_advice import SplitAdvisor
from dflash_tui.app import DflashApp
from dflash_tui.screens.main import MainScreen
from dflash_tui.screens.reply import ReplyDialog
from dflash_tui.screens.restart_dialog import RestartDialog
from dflash_tui.screens.restart_overrides import parse_overrides
from dflash_tui.sources.advised_split import read_advice, split_overrides
from dflash_tui.sources.state import RunState
from tests.tui.console_harness import (
    TRAINER,
    attached,
    make_run_dir,
    press_button,
    wait_for_controls,
    wait_until,
)
from tests.tui.synthetic_stream import RUN_ID

# How the trainer's run_start names the devices of an 8-GPU run at 5:3 (training/run.py).
TOPOLOGY_5_3 = {
    "target": [f"cuda:{i}" for i in range(5)],
    "drafter": ["cuda:5", "cuda:6", "cuda:7"],
    "world_size": 3,
}


def advice_fields() -> dict[str, Any]:
    """What the monitor writes for a 5:3 run whose targets (20 Ktok/s each) wait on a full
    pool for drafters of 12 Ktok/s each: 3:5 gives ~60 against ~36."""
    advisor = SplitAdvisor(5, 3)
    advisor.observe_tokens(8000)
    advisor.observe_queue(0.0, 0.9, 0.0)
    advisor.observe_queue(600.0, 0.9, 0.0)
    advisor.observe_profile({"target_fwd": 400.0, "drafter_fwd_bwd": 646.0, "optimizer": 21.0})
    fields = advisor.advice(600.0)
    assert fields is not None and fields["split"] == [3, 5]
    return fields


def line(kind: str, seq: int, **fields: Any) -> protocol.StatusLine:
    decoded = protocol.decode_line(
        protocol.encode_line(kind, seq=seq, run="r1", t=1000.0 + seq, **fields)
    )
    assert isinstance(decoded, protocol.StatusLine), decoded
    return decoded


def run_start(seq: int) -> protocol.StatusLine:
    return line(
        "run_start", seq, config={"epochs": 3}, topology=TOPOLOGY_5_3, dataset={},
        batches_per_epoch=10, total_steps=30, pid=1, host="box",
    )  # fmt: skip


def advice(seq: int) -> protocol.StatusLine:
    return line("event", seq, level="info", code="split_advice", **advice_fields())


def test_the_advised_split_takes_the_same_gpus_targets_first() -> None:
    assert split_overrides(TOPOLOGY_5_3, 3, 5) == "target_gpus=0,1,2 drafter_gpus=3,4,5,6,7"
    assert split_overrides(TOPOLOGY_5_3, 6, 2) == "target_gpus=0,1,2,3,4,5 drafter_gpus=6,7"
    # Whatever the order and the gaps: the run's own GPUs, the lowest ids the targets'.
    spread = {"target": ["cuda:6", "cuda:2"], "drafter": ["cuda:4"]}
    assert split_overrides(spread, 1, 2) == "target_gpus=2 drafter_gpus=4,6"


@pytest.mark.parametrize(
    ("topology", "split", "words"),
    [
        ({"target": ["cpu"], "drafter": ["cpu"]}, (1, 1), "not all GPUs"),
        ({"target_gpus": [0, 1], "drafter_gpus": [2]}, (1, 2), "names no target devices"),
        (TOPOLOGY_5_3, (3, 4), "the advice splits 7 GPUs; the run has 8: 0,1,2,3,4,5,6,7"),
        ({"target": ["cuda:0"], "drafter": ["cuda:0"]}, (1, 1), "splits 2 GPUs; the run has 1"),
    ],
)
def test_a_split_the_run_cannot_take_is_refused_by_reason(
    topology: dict[str, Any], split: tuple[int, int], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        split_overrides(topology, *split)


def test_only_advice_since_the_latest_run_start_is_current() -> None:
    state = RunState()
    state.apply(run_start(0))
    state.apply(advice(1))
    current = state.split_advice
    assert current is not None and (current.targets, current.drafters) == (3, 5)
    assert current.summary() == "3:5 targets:drafters would give ~60.0 Ktok/s against ~36.0 now"
    # A malformed advice line keeps the advice there was; the next trainer's start ends it.
    state.apply(line("event", 2, level="info", code="split_advice", message="?", split=[3]))
    assert state.split_advice == current
    state.apply(run_start(3))
    assert state.split_advice is None
    state.apply(line("event", 4, level="info", code="split_advice", message="m", split=[2, 6],
                     predicted_ktok_s=50.0))  # fmt: skip
    assert state.split_advice is not None and state.split_advice.seq == 4
    assert state.split_advice.summary() == "2:6 targets:drafters would give ~50.0 Ktok/s"
    assert read_advice(run_start(5)) is None


def test_the_overrides_pass_the_dialogs_check_and_the_boxs_restart_set(tmp_path: Path) -> None:
    text = split_overrides(TOPOLOGY_5_3, 3, 5)
    checked = parse_overrides(text, protocol.DEFAULT_SETTINGS)
    assert checked == {"target_gpus": "0,1,2", "drafter_gpus": "3,4,5,6,7"}
    # The real `dflash-train restart --set` applies them to the recorded run (a data dir
    # that is not there stops it before anything would start).
    train_args = ["--target-model", "random:tiny", "--data-dir", str(tmp_path / "none"),
                  "--target-gpus", "0,1,2,3,4", "--drafter-gpus", "5,6,7"]  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps({"train_args": train_args, "run_id": "r1"}))
    sets = [f"--set={key}={value}" for key, value in checked.items()]
    done = subprocess.run(
        [sys.executable, "-m", "dflash_train", "restart", str(tmp_path), *sets, "--wait", "5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    reply = protocol.decode_reply(done.stdout)
    assert isinstance(reply, protocol.Reply) and reply.error_code == "data_dir_unreadable", reply
    assert reply.data["changed"] == {
        "target_gpus": {"from": TOPOLOGY_5_3["target"], "to": ["cuda:0", "cuda:1", "cuda:2"]},
        "drafter_gpus": {
            "from": TOPOLOGY_5_3["drafter"],
            "to": ["cuda:3", "cuda:4", "cuda:5", "cuda:6", "cuda:7"],
        },
    }


# -- the console ---------------------------------------------------------------------------

STEPS = 40
RESTARTED = "target_gpus=0,1,2 drafter_gpus=3,4,5,6,7"


def write_lines(run_dir: Path, *lines: tuple[str, dict[str, Any]]) -> None:
    """Lines after the synthetic stream's, a second apart, its seq continued."""
    stream = run_dir / "status.jsonl"
    last = json.loads(stream.read_text().splitlines()[-1])
    with stream.open("a") as fh:
        for n, (kind, fields) in enumerate(lines, start=1):
            seq, t = last["seq"] + n, last["t"] + n
            fh.write(protocol.encode_line(kind, seq=seq, run=RUN_ID, t=t, **fields))


def advice_line() -> tuple[str, dict[str, Any]]:
    return "event", {"level": "info", "code": "split_advice", **advice_fields()}


def restarted_lines(data_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The first trainer's advice, then its end by a restart and the next trainer's start
    (resumed, on the 5:3 topology)."""
    end = {"reason": "signal", "exit_code": 0, "restarting": True}
    start = {
        "config": {"epochs": 6, "data_dir": str(data_dir)}, "topology": TOPOLOGY_5_3,
        "dataset": {}, "batches_per_epoch": 7, "total_steps": 42, "pid": 4343, "host": "gpu-box",
        "start_step": STEPS - 1, "resumed_from": "checkpoints/step_0000039",
    }  # fmt: skip
    return [advice_line(), ("run_end", end), ("run_start", start)]


def history_ended(app: DflashApp) -> bool:
    return any(e.code == "history_end" for e in app.state.events)


def advice_toasts(app: DflashApp) -> list[str]:
    return [text for title, text in app.toasts if title == "split advice"]


async def test_advice_is_shown_and_its_key_opens_the_restart_dialog_filled_in(
    tmp_path: Path,
) -> None:
    run_dir = make_run_dir(tmp_path, steps=STEPS)
    missing = tmp_path / "not-prepared"
    write_lines(run_dir, *restarted_lines(missing))
    # What the box restarts from: a data dir that is not there stops the restart before
    # anything would start, after the overrides were applied.
    train_args = ["--target-model", "random:tiny", "--data-dir", str(missing),
                  "--target-gpus", "0,1,2,3,4", "--drafter-gpus", "5,6,7"]  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps({"train_args": train_args, "run_id": RUN_ID}))
    async with attached(run_dir, steps=STEPS) as (app, pilot, transport):
        await wait_until(pilot, lambda: history_ended(app))
        # The first trainer's advice is in the events, not offered: a trainer started since.
        assert any(e.code == "split_advice" for e in app.state.events)
        assert app.state.split_advice is None and advice_toasts(app) == []
        await pilot.press("a")
        await wait_until(pilot, lambda: any("no split advice" in t for _, t in app.toasts))
        assert isinstance(app.screen, MainScreen)

        write_lines(run_dir, advice_line())  # the running trainer's own advice, live
        await wait_until(pilot, lambda: bool(advice_toasts(app)))
        assert advice_toasts(app) == [
            "3:5 targets:drafters would give ~60.0 Ktok/s against ~36.0 now "
            "— press a to restart with it"
        ]
        await pilot.press("a")
        await wait_until(pilot, lambda: isinstance(app.screen, RestartDialog))
        dialog = app.screen
        assert dialog.query_one("#overrides", Input).value == RESTARTED
        assert transport.mutating() == []  # nothing is sent before the operator confirms
        await press_button(pilot, "#submit")
        await wait_for_controls(pilot)
        await wait_until(pilot, lambda: isinstance(app.screen, ReplyDialog))
    (argv,) = transport.mutating()
    assert argv[len(TRAINER) :][:2] == ["restart", str(run_dir)]
    assert argv[-4:] == ["--target-gpus", "0,1,2", "--drafter-gpus", "3,4,5,6,7"]
    reply = app.replies[-1]
    assert reply.error_code == "data_dir_unreadable", reply
    assert reply.data["changed"]["target_gpus"]["to"] == ["cuda:0", "cuda:1", "cuda:2"]
    assert reply.data["changed"]["drafter_gpus"]["to"][0] == "cuda:3"


async def test_watch_mode_shows_current_advice_on_attach_but_refuses_its_key(
    tmp_path: Path,
) -> None:
    run_dir = make_run_dir(tmp_path, steps=STEPS)
    write_lines(run_dir, *restarted_lines(tmp_path / "data"), advice_line())
    async with attached(run_dir, steps=STEPS, read_only=True) as (app, pilot, transport):
        await wait_until(pilot, lambda: bool(advice_toasts(app)))
        (shown,) = advice_toasts(app)
        assert shown.startswith("3:5 targets:drafters would give ~60.0") and "press" not in shown
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)
    assert transport.mutating() == []
