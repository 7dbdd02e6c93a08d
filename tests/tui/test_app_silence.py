"""How long the run has been silent is counted from its last line, not from the attach:
the box's `history_end` marker dates that line (heartbeats included, though the summary
keeps none) on the box's own clock, and the console takes the smaller of that and its own
clock's view, so a run dead for hours says so at once and a laptop clock running ahead of
the box does not make a live run look stalled."""

from __future__ import annotations

import time
from pathlib import Path

from dflash_train import protocol
from dflash_tui.widgets.header import RunHeader
from tests.tui.conftest import start_stream_writer
from tests.tui.console_harness import console_app, wait_until
from tests.tui.synthetic_stream import RUN_ID, write_stream


def header_text(app) -> str:  # type: ignore[no-untyped-def]
    return str(app.screen.query_one(RunHeader).render())


def history_ended(app) -> bool:  # type: ignore[no-untyped-def]
    return any(e.code == "history_end" for e in app.state.events)


async def test_a_run_silent_for_hours_before_the_attach_says_so(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    last = write_stream(run_dir, 300)
    app, transport = console_app(run_dir, clock=lambda: last + 3 * 3600 + 5)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: "CRASHED" in header_text(app), timeout=20)
        assert "last update 3h 00m ago" in header_text(app)
        assert transport.subcommands()[:2] == ["tail", "status"]  # asked as the history ended


async def test_heartbeats_after_the_last_step_keep_an_attached_run_live(tmp_path: Path) -> None:
    """Steps stopped five minutes ago (a long checkpoint, say) but heartbeats went on to a
    second ago: running, and no `status` asked of the box."""
    run_dir = tmp_path / "run"
    last = write_stream(run_dir, 300)
    with (run_dir / "status.jsonl").open("a", encoding="utf-8") as fh:
        for n, t in enumerate(range(int(last) + 10, int(last) + 300, 10)):
            fh.write(protocol.encode_line("heartbeat", seq=100_000 + n, run=RUN_ID, t=t))
    newest = float(int(last) + 290)
    start = time.time()
    app, transport = console_app(run_dir, clock=lambda: newest + 1 + time.time() - start)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: history_ended(app) and "RUNNING" in header_text(app))
        age = app.state.last_line_age()
        assert age is not None and age < 30, age
        assert app.state.run_state == "running"
        assert "status" not in transport.subcommands()


async def test_a_laptop_clock_an_hour_ahead_does_not_stall_a_live_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    writer = start_stream_writer(run_dir, "live0000run", 2000, 0.05)
    stream = run_dir / "status.jsonl"
    try:
        deadline = time.monotonic() + 30
        while not stream.is_file() or not stream.stat().st_size:  # its first line written
            assert time.monotonic() < deadline, "the writer wrote nothing"
            time.sleep(0.05)
        app, transport = console_app(run_dir, clock=lambda: time.time() + 3600)
        async with app.run_test(size=(160, 48)) as pilot:
            # The header redraws on its own tick after the state changes: wait for it too.
            await wait_until(
                pilot,
                lambda: (
                    history_ended(app)
                    and app.state.step is not None
                    and "RUNNING" in header_text(app)
                ),
            )
            age = app.state.last_line_age()
            assert age is not None and age < 30, age
            assert app.state.run_state == "running" and "STALLED" not in header_text(app)
            assert "status" not in transport.subcommands()
    finally:
        writer.kill()
        writer.wait()
