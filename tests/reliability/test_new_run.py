"""Fault: the run the console follows is replaced under it. First a new run starts in the same
directory while the console is attached (the writer rotates the old stream aside and
starts over at seq 0); then the box "reboots": the connection is cut, the run directory is
deleted and re-created by a third run, and the console reconnects with a cursor that
belongs to a run that no longer exists. Asserted: each time the console notices the new
run id and starts a fresh history (no step, metric or event of an earlier run mixed in),
and it receives every line of each run exactly once."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tests.reliability.console_side import Recorder, ssh_transport, trusted, wait_until
from tests.sshd import ClientKey, InProcessServer
from tests.tui.conftest import start_stream_writer

COUNTS = {"run-a": 120, "run-b": 80, "run-c": 60}


def finish(run_dir: Path, run: str) -> None:
    writer = start_stream_writer(run_dir, run, COUNTS[run], 0.005)
    assert writer.wait(60) == 0


async def test_new_run_in_the_same_dir_and_a_replaced_dir_start_fresh(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    finish(run_dir, "run-a")
    known = trusted(tmp_path / "known_hosts", inproc_server.port, inproc_server.host_key)
    transport = ssh_transport(inproc_server.port, known, client_key)
    console = Recorder()
    session = console.session(transport, run_dir, read_only=True, history_points=0)
    follow = asyncio.create_task(session.follow())
    try:
        await wait_until(lambda: session.cursor == ("run-a", COUNTS["run-a"] - 1), what="run A")
        assert console.state.step == COUNTS["run-a"] - 1

        # A new run in the same directory, while attached.
        finish(run_dir, "run-b")
        await wait_until(lambda: session.cursor == ("run-b", COUNTS["run-b"] - 1), what="run B")
        assert (run_dir / "status.run-a.jsonl").exists()  # the old stream was kept aside
        state = console.state
        assert state.run_id == "run-b" and state.step == COUNTS["run-b"] - 1
        assert [s for s, _ in state.metrics["loss"]] == list(range(COUNTS["run-b"]))
        assert state.lines_applied == COUNTS["run-b"]

        # The box reboots: connection gone, directory gone, a new run in a new directory.
        assert inproc_server.drop_connections() >= 1
        shutil.rmtree(run_dir)
        await wait_until(lambda: console.count("reconnecting") >= 1, what="a retry")
        finish(run_dir, "run-c")
        await wait_until(lambda: session.cursor == ("run-c", COUNTS["run-c"] - 1), what="run C")
        await asyncio.sleep(0.3)
    finally:
        follow.cancel()
        await transport.close()
    state = console.state
    assert state.run_id == "run-c" and state.step == COUNTS["run-c"] - 1
    assert [s for s, _ in state.metrics["loss"]] == list(range(COUNTS["run-c"]))
    assert state.lines_applied == COUNTS["run-c"] and not console.rejected
    assert console.runs == ["run-a", "run-b", "run-c"]
    for run, count in COUNTS.items():
        assert console.live_seqs(run) == list(range(count)), run
    # The reconnect asked to resume run B; the box answered with run C from its start.
    resumed = [c for c in inproc_server.received() if "--run run-b" in c]
    assert resumed, inproc_server.received()
