"""GPU readings sent on attach are as old as their line: a run silent for two minutes
whose newest gpu line the box sends whole after its history summary (the saved summary's
fast path) reads '130 s old' in the GPU pane, not '0 s old'."""

from __future__ import annotations

import time
from pathlib import Path

from dflash_train import protocol
from dflash_train.protocol import StatusLine
from dflash_tui.widgets.gpu_table import GpuTable
from tests.tui.console_harness import console_app, wait_until

RUN = "gpuage01"


def line(kind: str, seq: int, t: float, **fields: object) -> StatusLine:
    decoded = protocol.decode_line(protocol.encode_line(kind, seq=seq, run=RUN, t=t, **fields))
    assert isinstance(decoded, StatusLine), decoded
    return decoded


async def test_gpu_readings_from_an_attach_show_their_real_age(tmp_path: Path) -> None:
    now = time.time()
    app, _ = console_app(tmp_path / "run", clock=lambda: now)
    gpus = [{"index": 0, "role": "drafter", "util": 50.0, "mem_used": 1.0, "mem_total": 2.0}]
    async with app.run_test(size=(160, 48)) as pilot:
        app._on_line(line("run_start", 0, now - 200, config={}, topology={}, dataset={},
                          batches_per_epoch=9, total_steps=9, pid=1, host="box"))  # fmt: skip
        app._on_line(line("gpu", 1, now - 130, available=True, gpus=gpus))
        app._on_line(line("heartbeat", 2, now - 120))
        # The box's end of history, sent now: its stream's last line is 120 s old.
        end = {"cursor": 2, "lines_summarised": 3, "last_t": now - 120}
        app._on_line(line("event", 2, now, level="info", code="history_end", message="",
                          history=True, **end))  # fmt: skip
        pane = app.screen.query_one(GpuTable)
        await wait_until(pilot, lambda: "trainer's readings" in str(pane.border_subtitle))
        assert "· 130 s old" in str(pane.border_subtitle)
