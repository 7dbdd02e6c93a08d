"""A crashed run: the badge says so and the events pane shows the tail of train.log, which
the console gets from the box's own `dflash-train status`."""

from __future__ import annotations

from pathlib import Path

from dflash_train import protocol
from dflash_tui.widgets.events_log import EventsLog
from dflash_tui.widgets.header import RunHeader
from tests.tui.console_harness import attached, make_run_dir, wait_until
from tests.tui.synthetic_stream import RUN_ID

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "trainer.py", line 412, in drafter_step',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
]


async def test_crash_shows_badge_and_log_tail(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    (run_dir / "train.log").write_text("step 299 ok\n" + "\n".join(TRACEBACK) + "\n")
    with (run_dir / "status.jsonl").open("a") as fh:
        fh.write(
            protocol.encode_line(
                "run_end", seq=9999, run=RUN_ID, reason="error", exit_code=1,
                error_tail=TRACEBACK[-1],
            )
        )  # fmt: skip
    async with attached(run_dir) as (app, pilot, transport):
        header = app.screen.query_one(RunHeader)
        await wait_until(pilot, lambda: "CRASHED" in str(header.render()))
        await wait_until(pilot, lambda: bool(app.log_tail), timeout=30)
        assert TRACEBACK[-1] in app.log_tail
        events = app.screen.query_one(EventsLog)
        await wait_until(pilot, lambda: "train.log (last" in str(events.render()))
        shown = str(events.render())
        assert "out of memory" in shown
        # The tail is labelled and leaves the alert in sight above it.
        assert "ALERT run crashed" in shown
        assert shown.index("ALERT run crashed") < shown.index("train.log (last")
        assert "status" in transport.subcommands()
        assert transport.mutating() == []


async def test_rejected_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    async with attached(run_dir) as (app, pilot, _):
        with (run_dir / "status.jsonl").open("a") as fh:
            fh.write('not json\n{"v": 1, "seq": 9000}\n')
        events = app.screen.query_one(EventsLog)
        await wait_until(pilot, lambda: events.border_subtitle == "rejected lines: 2")
        assert "RUNNING" in str(app.screen.query_one(RunHeader).render())
