"""A crashed run: the badge says so and the events pane shows the tail of train.log, which
the console gets from the box's own `dflash-train status`."""

from __future__ import annotations

from pathlib import Path

from dflash_train import protocol
from dflash_tui.widgets.events_log import EventsLog
from dflash_tui.widgets.header import RunHeader
from tests.tui.console_harness import attached, live_clock, make_run_dir, wait_until
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


# What faulthandler writes when a trainer dies in native code (the trainer installs it).
CRASH_REPORT = [
    "Fatal Python error: Segmentation fault",
    "",
    "Stack (most recent call first):",
    '  File "/opt/dflash/model/drafter.py", line 301 in forward',
    '  File "/opt/dflash/training/loop.py", line 88 in step',
    *[f'  File "/opt/dflash/outer{i}.py", line {i} in outer{i}' for i in range(40)],
    "",
    "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)",
]


async def test_a_trainer_dead_before_the_attach_reads_crashed_at_once_with_its_report(
    tmp_path: Path,
) -> None:
    """A run whose trainer died in native code before the console attached, 20 s after its
    last line: the console asks `status` at once (not once the run reads stalled, a minute
    on), and shows the crash report's head, where the cause and the innermost frame are."""
    run_dir = make_run_dir(tmp_path)
    (run_dir / "train.log").write_text("step 299 ok\n" + "\n".join(CRASH_REPORT) + "\n")
    live = live_clock(run_dir)
    async with attached(run_dir, clock=lambda: live() + 20.0) as (app, pilot, transport):
        header = app.screen.query_one(RunHeader)
        await wait_until(pilot, lambda: "CRASHED" in str(header.render()))
        age = app.state.last_line_age()
        assert age is not None and age < app.state.stall_after  # never read stalled first
        await wait_until(pilot, lambda: bool(app.log_tail))
        assert app.log_tail[0] == CRASH_REPORT[0]
        events = app.screen.query_one(EventsLog)
        await wait_until(pilot, lambda: "crash report (first" in str(events.render()))
        shown = str(events.render())
        assert "ALERT run crashed" in shown and "train.log: Fatal Python error" in shown
        assert "line 301 in forward" in shown  # the innermost frame, not the outer ones
        assert "Extension modules" not in shown
        assert transport.subcommands().count("status") == 1
        assert transport.mutating() == []
