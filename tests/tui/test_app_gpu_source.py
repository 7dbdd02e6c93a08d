"""The GPU pane never shows a frozen past as the present: while the trainer's `gpu` lines
come, they are shown; once they are older than two monitor ticks, the box's own
`dflash-train gpus --follow` readings (NVML stand-in: no GPU here) take over, with roles
kept and the processes holding each GPU, and the pane says whose readings they are."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from dflash_train.stream.writer import StatusWriter
from dflash_tui.widgets.gpu_table import GpuTable
from tests.tui.console_harness import console_app, wait_until

STANDIN = Path(__file__).resolve().parents[1] / "nvml_standin"


def trainer_gpus(util: float) -> list[dict[str, object]]:
    return [
        {"index": 0, "role": "target", "util": util, "mem_used": 9000.0, "mem_total": 143771.0},
        {"index": 1, "role": "drafter", "util": util, "mem_used": 9000.0, "mem_total": 143771.0},
    ]


async def test_stale_trainer_readings_give_way_to_the_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))
    monkeypatch.setenv("NVML_STANDIN_PIDS", str(os.getpid()))
    run_dir = tmp_path / "run"
    writer = StatusWriter(run_dir / "status.jsonl", "gpurun")
    writer.write("run_start", config={"epochs": 1}, topology={}, dataset={}, batches_per_epoch=9,
                 total_steps=9, pid=os.getpid(), host="box")  # fmt: skip
    now = [time.time()]
    app, _ = console_app(run_dir, clock=lambda: now[0])
    app.options = dataclasses.replace(app.options, follow_gpus=True)
    async with app.run_test(size=(160, 48)) as pilot:
        pane = app.screen.query_one(GpuTable)
        await wait_until(pilot, lambda: app.seen["run_start"] == 1)
        await pilot.pause(0.5)  # past the attach's history summary: what follows is live
        writer.write("gpu", available=True, gpus=trainer_gpus(42.0))
        await wait_until(pilot, lambda: app.gpu_source.showing == "trainer")
        await pilot.pause(2.5)  # box readings arrive every 2 s: not shown while current
        assert [g["util"] for g in app.state.gpus] == [42.0, 42.0]
        await wait_until(pilot, lambda: "trainer's readings" in str(pane.border_subtitle))

        now[0] += 11  # the trainer has been silent for over two 5 s ticks
        await wait_until(pilot, lambda: app.gpu_source.showing == "box", timeout=10)
        assert [g["util"] for g in app.state.gpus] == [100.0, 0.0]
        assert [g["role"] for g in app.state.gpus] == ["target", "drafter"]  # kept
        await wait_until(pilot, lambda: "box `gpus --follow`" in str(pane.border_subtitle))
        assert "trainer silent 11 s" in str(pane.border_subtitle)
        me = Path("/proc/self/comm").read_text().strip()
        await wait_until(pilot, lambda: f"pid {os.getpid()} {me} 8.0 GiB" in str(pane.render()))

        writer.write("gpu", available=True, gpus=trainer_gpus(55.0))  # it is back
        await wait_until(pilot, lambda: app.gpu_source.showing == "trainer")
        await pilot.pause(2.5)
        assert [g["util"] for g in app.state.gpus] == [55.0, 55.0]
    writer.close()
