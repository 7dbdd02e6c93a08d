"""A fleet row across a restart by someone else: while the box's `status` answers restarting
the row reads RESTARTING, and once the new trainer's run_start reaches the row's tail it reads
RUNNING at once, not at the next `status` (seen in tmux: 13 s late at the 15 s cadence)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from dflash_train.rundir import RunDir, RunLock
from dflash_train.stream.reader import last_record
from dflash_train.stream.writer import StatusWriter
from dflash_tui.sources.fleet import Fleet
from dflash_tui.sources.profiles import Profile
from tests.reliability.console_side import wait_until
from tests.tui.fleet_box import start_live_run

RUN = "restart0run"


def lines_written(run_dir: Path) -> int:
    last = last_record(run_dir / "status.jsonl")
    return -1 if last is None else last.seq


async def test_row_reads_running_when_the_new_trainer_speaks_not_at_the_next_status(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    old = start_live_run(run_dir, RUN, interval=0.1)
    new = None
    # One status at the start, none for ten minutes after: only the tail can move the row on.
    fleet = Fleet([Profile("box", run_dir=str(run_dir), python=sys.executable)], status_every=600)
    try:
        await wait_until(lambda: lines_written(run_dir) > 5, what="the old trainer's steps")
        # The restart: it holds restart.lock, stops the old trainer, whose run_end says so.
        with RunLock(RunDir.at(run_dir).restart_lock):
            old.send_signal(signal.SIGKILL)
            old.wait()
            writer = StatusWriter(run_dir / "status.jsonl", RUN)
            writer.write("run_end", reason="signal", exit_code=0, restarting=True)
            writer.close()
            fleet.start()
            row = fleet.rows["box"]
            await wait_until(
                lambda: fleet.views()[0].badge == "restarting", timeout=120, what="restarting"
            )
            assert (row.status or {}).get("state") == "restarting", row.status
            polled_at = row.status_at
            # The new trainer (same run, resumed) starts while the restart still holds the lock.
            new = start_live_run(run_dir, RUN, interval=0.1)
        await wait_until(lambda: fleet.views()[0].badge == "running", timeout=120, what="running")
        assert row.status_at == polled_at  # the tail said it, not a newer status
        assert (row.status or {}).get("state") == "restarting"
    finally:
        await fleet.close()
        for proc in (old, new):
            if proc is not None:
                proc.kill()
                proc.wait()
