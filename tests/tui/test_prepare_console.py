"""A launched prepare (`dflash-train launch RUN --prepare -- ...`, the real SmolLM2 target on the
CPU) streams `prepare` progress lines under the control plane, and the console shows the run
as PREPARING with the prepare's progress in the queue pane's place and its answer tokens/s
in the throughput pane, then FINISHED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dflash_train import protocol
from dflash_tui.pane_refresh import header_facts
from dflash_tui.widgets.header import RunHeader
from dflash_tui.widgets.hs_queue import HsQueuePane
from dflash_tui.widgets.loss_plot import PREPARE_ONLY, LossPane
from dflash_tui.widgets.throughput_plot import ThroughputPane
from tests.tui.console_harness import console_app, wait_until

PREPARE = ["--target-model", "smollm2", "--prompts", "builtin", "--samples", "3"]
PREPARE += ["--max-new-tokens", "6", "--batch-size", "1", "--chunk-size", "1", "--devices", "cpu"]
PREPARE += ["--heldout", "0"]  # the built-in eval split would be answered too


def _dflash(*args: str) -> protocol.Reply:
    result = subprocess.run(
        [sys.executable, "-m", "dflash_train", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    reply = protocol.decode_reply(result.stdout)
    assert isinstance(reply, protocol.Reply), (result.stdout, result.stderr[-2000:])
    return reply


async def test_a_launched_prepare_streams_progress_and_reads_preparing(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "data"
    reply = _dflash("launch", str(run_dir), "--prepare", "--", *PREPARE, "--out", str(out))
    assert reply.ok, (reply.error, reply.data.get("log_tail"))
    try:
        app, _ = console_app(run_dir)
        async with app.run_test(size=(160, 48)) as pilot:
            header = app.screen.query_one(RunHeader)
            await wait_until(pilot, lambda: "PREPARING" in str(header.render()), timeout=120)
            assert app.state.mode == "prepare"
            pane = app.screen.query_one(HsQueuePane)
            await wait_until(pilot, lambda: app.state.prepare is not None, timeout=120)
            await wait_until(pilot, lambda: "answer tok/s" in str(pane.render()), timeout=30)
            assert pane.border_title == "2 prepare"
            # No training metric in a prepare-only run: the metrics pane says so.
            metrics = app.screen.query_one(LossPane).query_one(".pane-summary")
            await wait_until(pilot, lambda: PREPARE_ONLY in str(metrics.render()))
            # The header's ETA is the prepare's own once its lines say how long is left.
            await wait_until(pilot, lambda: app.state.prepare["eta_s"] is not None, timeout=120)
            eta = header_facts(app, app.clock()).eta_s
            assert eta is not None and eta == app.state.prepare["eta_s"]
            await wait_until(pilot, lambda: app.state.end is not None, timeout=240)
            assert app.state.end["reason"] == "completed"
            await wait_until(pilot, lambda: "FINISHED" in str(header.render()))
            # The pane redraws on the app's timer, maybe after the header: wait for it.
            assert app.state.prepare["answers_done"] == 3
            await wait_until(pilot, lambda: "answers 3/3" in str(pane.render()))
            # Ended, it has no time left: neither the header nor the pane keeps the last
            # line's ETA (a prepare cut by --max-seconds showed "ETA 18m 31s" when FINISHED).
            assert header_facts(app, app.clock()).eta_s is None
            await wait_until(pilot, lambda: "ETA –" in str(pane.render()))
            # The throughput pane plots the answer tokens/s against the answer tokens made.
            throughput = app.screen.query_one(ThroughputPane)

            def plotted() -> bool:
                series = throughput.drawn.get("prepare_tok_s")
                made = app.state.prepare["answer_tokens"]
                return series is not None and series.last_x == made

            await wait_until(pilot, plotted)
            summary = str(throughput.query_one(".pane-summary").render())
            assert "answer tok/s now" in summary and "answer tokens" in summary, summary
            assert all(y >= 0 for y in throughput.drawn["prepare_tok_s"].means)
    finally:
        _dflash("stop", str(run_dir), "--timeout", "30")
    lines = [json.loads(x) for x in (run_dir / "status.jsonl").read_text().splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds[0] == "run_start" and lines[0]["mode"] == "prepare" and kinds[-1] == "run_end"
    progress = [line for line in lines if line["kind"] == "prepare"]
    assert progress and all(protocol.decode_line(json.dumps(p)).kind == "prepare" for p in progress)
    last = progress[-1]
    assert last["answers_done"] == last["answers_total"] == 3 and last["prompts_done"] == 3
    assert [d["device"] for d in last["devices"]] == ["cpu"] and last["answer_tokens"] > 0
    assert lines[-1]["samples"] == 3 and lines[-1]["unanswered"] == 0
    status = _dflash("status", str(run_dir))
    assert status.ok and status.data["state"] == "finished"
    assert (out / "prepare.json").is_file()
