"""The whole-run views, driven by Pilot on a real run directory through the real
`dflash-train` commands: `z` ranges, `x` steps or time, `v` metrics, `h` GPU heat, `i` run
details, `c` checkpoints."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from dflash_train import protocol
from dflash_tui.app import DflashApp
from dflash_tui.screens.checkpoints_screen import CheckpointsScreen
from dflash_tui.screens.run_details import RunDetailsScreen, run_details
from dflash_tui.widgets.gpu_heatmap import GpuHeatmap
from dflash_tui.widgets.loss_plot import LossPane
from dflash_tui.widgets.metric_plot import PLOTS
from dflash_tui.widgets.throughput_plot import ThroughputPane
from tests.tui.console_harness import attached, make_run_dir, wait_until
from tests.tui.synthetic_stream import RUN_ID, T0

# 0.5 s a step: 37.5 minutes, so the last-10-minutes range holds the newest 1,200 steps.
STEPS = 4500
SUMMARY_BUCKET = 32


def summary(pane: LossPane | ThroughputPane) -> str:
    return str(pane.query_one(".pane-summary", Static).render())


async def test_z_x_v_and_h_change_what_the_plots_and_the_gpu_history_show(
    tmp_path: Path,
) -> None:
    async with attached(make_run_dir(tmp_path, STEPS), steps=STEPS) as (app, pilot, _):
        loss = app.screen.query_one(LossPane)
        throughput = app.screen.query_one(ThroughputPane)
        await wait_until(pilot, lambda: "loss" in loss.drawn)
        assert loss.drawn["loss"].xs[0] == 0 and loss.drawn["loss"].last_x == STEPS - 1
        assert "whole run · steps" in summary(loss)

        seen = []
        for _ in range(3):  # z: last 6 h, last 1 h, last 10 min
            await pilot.press("z")
            await wait_until(pilot, lambda: app.screen.plot_view.range_name in summary(loss))
            seen.append((app.screen.plot_view.range_name, loss.drawn["loss"].xs[0]))
        assert [name for name, _ in seen] == ["last 6 h", "last 1 h", "last 10 min"]
        assert seen[0][1] == 0 and seen[1][1] == 0  # the run is younger than an hour
        # Right after attach the past is the box's summary (400 points a series: buckets of
        # 32 steps here), so the range starts at the first summary point in its 10 minutes.
        ten_minutes_ago = STEPS - 1200
        assert ten_minutes_ago <= seen[2][1] < ten_minutes_ago + 2 * SUMMARY_BUCKET
        assert throughput.drawn["ktok_s"].xs[0] == seen[2][1]

        await pilot.press("x")  # wall time on the x axis
        await wait_until(pilot, lambda: "last 10 min · time" in summary(loss))
        last_t = T0 + 30 + (STEPS - 1) * 0.5
        assert loss.drawn["loss"].last_x == last_t
        assert last_t - 600 <= loss.drawn["loss"].xs[0] < last_t - 600 + SUMMARY_BUCKET
        await pilot.press("z", "x")  # back to the whole run, in steps
        await wait_until(pilot, lambda: "whole run · steps" in summary(loss))
        assert loss.drawn["loss"].xs[0] == 0

        titles, summaries = [], {}
        for choice in PLOTS[1:]:  # v: every metric in turn
            await pilot.press("v")
            await wait_until(pilot, lambda c=choice: loss.choice is c and loss.drawn is not None)
            app.request_redraw()
            await pilot.pause(0.1)
            titles.append(loss.border_title)
            summaries[choice.id] = summary(loss)
            if choice.id in ("acc", "grad_norm", "lr", "ktok_s", "starved"):
                assert loss.drawn[choice.series[0]].xs[0] == 0, choice
        assert titles == [f"4 {c.title}" for c in PLOTS[1:]]
        assert "nothing recorded yet" in summaries["stages"]  # no profile lines here
        await pilot.press("v")
        assert loss.choice.id == "loss"

        heatmap = app.screen.query_one(GpuHeatmap)
        rows = str(heatmap.render()).splitlines()
        assert len(rows) == 9 and rows[5].split()[:2] == ["5", "drafter"]
        await pilot.press("h")
        await wait_until(pilot, lambda: "power" in str(heatmap.border_title))
        assert heatmap.value == "power_w"


def checkpoint_folders(run_dir: Path) -> None:
    """On the box: step 4,000 complete, step 2,000 pruned since, step 4,400 half written."""
    folder = run_dir / "checkpoints" / RUN_ID
    done = folder / "step_0004000"
    done.mkdir(parents=True)
    (done / "drafter.safetensors").write_bytes(b"w" * 3000)
    marker = {"step": 4000, "files": {"drafter.safetensors": 3000}, "written_at": T0 + 2030}
    (done / "complete").write_text(json.dumps(marker))
    (folder / "step_0004400").mkdir()
    (folder / "step_0004400" / "drafter.safetensors").write_bytes(b"w" * 100)


async def test_i_shows_the_run_details_and_c_lists_its_checkpoints(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, STEPS)
    checkpoint_folders(run_dir)
    async with attached(run_dir, steps=STEPS) as (app, pilot, transport):
        await pilot.press("i")
        assert isinstance(app.screen, RunDetailsScreen)
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(run_details(app.screen.start, app.screen.run_id))
        text = console.export_text()
        for expected in ("Qwen/Qwen3-8B", "batches_per_epoch", "750", "drafter_gpus", "800000"):
            assert expected in text, expected
        await pilot.press("escape")
        assert not isinstance(app.screen, RunDetailsScreen)

        await pilot.press("c")
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        await wait_until(pilot, lambda: "asking" not in screen.note)
        assert "status" in transport.subcommands()
        assert "2 on the box" in screen.note
        table = screen.query_one(DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert [row[0] for row in rows] == ["4,400", "4,000", "2,000"]
        assert [row.state for row in screen.rows] == ["incomplete", "complete", "pruned"]
        # Size on the box (its marker too) and the seconds the save took.
        assert rows[1][2] == "3.0 KB" and rows[1][3] == "4.2"
        await pilot.press("escape")
        assert not isinstance(app.screen, CheckpointsScreen)


def test_the_run_details_say_which_weights_the_drafter_began_from() -> None:
    # run_start's init_from as the trainer writes it for `train --init-from EXPORT`.
    source = {
        "path": "/data/exports/qwen27b-r5", "kind": "export", "run": "4250f4f882ca",
        "step": 3683, "sha256": "ee6d6869" + "0" * 56,
    }  # fmt: skip
    record = {
        "v": 1, "seq": 0, "t": T0, "run": "r6", "kind": "run_start", "config": {},
        "topology": {}, "dataset": {}, "batches_per_epoch": 8, "total_steps": 80, "pid": 7,
        "host": "box", "start_step": 0, "init_from": source,
    }  # fmt: skip
    start = protocol.decode_line(json.dumps(record).encode())
    assert isinstance(start, protocol.StatusLine)
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(run_details(start, "r6"))
    text = console.export_text()
    row = next(line.split() for line in text.splitlines() if "init_from" in line)
    assert row == ["init_from", "export", "/data/exports/qwen27b-r5", "(run", "4250f4f882ca,",
                   "step", "3683)"]  # fmt: skip
    assert "also recorded" not in text  # said once, in the run's section


async def test_a_status_answer_while_the_checkpoints_screen_closes_is_dropped(
    tmp_path: Path,
) -> None:
    run_dir = make_run_dir(tmp_path, 50)
    async with attached(run_dir, steps=50) as (app, pilot, _):
        await pilot.press("c")
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        await wait_until(pilot, lambda: "asking" not in screen.note)
        # Closing: the screen is still attached while its widgets go (the watch fuzzer's
        # key storm met a status answer in that window, and NoMatches ended the app).
        await screen.query_one("#checkpoints-note").remove()
        screen.show_listing([], "a late answer")
        assert screen.note == "a late answer"
        await pilot.press("escape")
        assert not isinstance(app.screen, CheckpointsScreen)
        screen.show_listing(None, "later still")
        await pilot.pause()
        assert app.is_running


async def test_the_tau_plot_says_how_often_held_out_rounds_kept_the_first_draft(
    tmp_path: Path,
) -> None:
    """A held-out evaluation's rounds by length (its event's round_lengths: the committed
    quality export's, 2026-12-05) read beside the tau plot as the share of rounds that kept
    the first draft, where the line has room for it and its range label; an evaluation
    without them (a hybrid's) shows no share."""
    run_dir = make_run_dir(tmp_path, 300)
    stream = run_dir / "status.jsonl"
    last = json.loads(stream.read_text().splitlines()[-1])
    rounds = [1646, 976, 597, 316, 108, 35, 14, 3, 4, 2, 1, 0, 1, 1, 0, 0]
    figures = {"level": "info", "code": "eval", "message": "held-out tau", "tau_tf": None,
               "lossless": True, "prompts": 40, "tokens": 256, "seconds": 1.3}  # fmt: skip
    with stream.open("a", encoding="utf-8") as fh:
        fh.write(
            protocol.encode_line(
                "event", seq=last["seq"] + 1, run=RUN_ID, t=last["t"], step=299, tau=2.057,
                round_lengths=rounds, **figures,
            )
        )  # fmt: skip

    async def tau_summary(pilot: Pilot[None], app: DflashApp) -> str:
        loss = app.screen.query_one(LossPane)
        await wait_until(pilot, lambda: app.state.heldout is not None)
        while loss.choice.id != "tau":
            await pilot.press("v")
        await wait_until(pilot, lambda: "held-out" in summary(loss))
        return summary(loss)

    async with attached(run_dir, size=(120, 40)) as (app, pilot, _):
        narrow = await tau_summary(pilot, app)
        assert "1st draft" not in narrow and narrow.endswith("whole run · steps")
    async with attached(run_dir, size=(220, 48)) as (app, pilot, _):
        assert app.state.heldout.first_kept == sum(rounds[1:]) / sum(rounds)  # 0.556
        wide = await tau_summary(pilot, app)
        assert "1st draft kept 56%   whole run · steps" in wide
        # A teacher-forced-only evaluation (a hybrid target's) has no rounds to read.
        figures |= {"tau_tf": 2.3, "lossless": None, "prompts": 0}
        app.state.apply(protocol.decode_line(protocol.encode_line(
            "event", seq=last["seq"] + 2, run=RUN_ID, t=last["t"], step=300, tau=None,
            **figures)))  # fmt: skip
        assert app.state.heldout.step == 300 and app.state.heldout.first_kept is None
        app.request_redraw()
        loss = app.screen.query_one(LossPane)
        await wait_until(pilot, lambda: "1st draft" not in summary(loss))
