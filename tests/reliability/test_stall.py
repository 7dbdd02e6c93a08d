"""Fault: the trainer hangs: its process group is SIGSTOPped, so it keeps its lock (it is
alive) but writes nothing, as a deadlocked or wedged process would. Asserted: both the
box (`status --stall-after`) and a console following over SSH say `stalled` once the
configured threshold has passed and not before, and `running` again when it resumes."""

from __future__ import annotations

import asyncio
import signal
import time

from tests.reliability import box
from tests.reliability.conftest import LiveRun
from tests.reliability.console_side import Recorder, ssh_transport, wait_until
from tests.sshd import ClientKey

# Above the trainer's longest healthy silence (heartbeat 5 s when nothing else is written).
STALL_AFTER_S = 6.0


async def test_hung_trainer_reads_stalled_within_the_threshold(
    live_run: LiveRun, client_key: ClientKey
) -> None:
    run_dir = live_run.run_dir
    transport = ssh_transport(live_run.server.port, live_run.known_hosts, client_key)
    console = Recorder(stall_after=STALL_AFTER_S)
    session = console.session(transport, run_dir, read_only=True)
    follow = asyncio.create_task(session.follow())
    try:
        await wait_until(lambda: console.state.run_state == "running", what="a live run")
        seen = len(console.lines)
        await wait_until(lambda: len(console.lines) > seen + 2, what="fresh lines")
        assert box.status(run_dir, STALL_AFTER_S).data["state"] == "running"

        box.signal_group(run_dir, signal.SIGSTOP)
        hung_at = time.time()
        last_t = box.lines(run_dir)[-1].t
        box_stalled_at = console_stalled_at = None
        while box_stalled_at is None or console_stalled_at is None:
            now = time.time()
            assert now - hung_at < STALL_AFTER_S + 20, "no stall reported"
            if box_stalled_at is None:
                # In a thread: a blocking status (seconds on a loaded machine) would stop the
                # console's loop, and its lines and stall clock with it.
                reply = await asyncio.to_thread(box.status, run_dir, STALL_AFTER_S)
                assert reply.data["state"] in ("running", "stalled")
                if reply.data["state"] == "stalled":
                    # When the box decided: its reply's age of the last line, not when the
                    # reply came back (a status takes seconds on a loaded machine).
                    box_stalled_at = last_t + reply.data["last_line_age"]
                    assert reply.data["pid"] == live_run.launch_reply.data["pid"]
            if console_stalled_at is None and console.state.run_state == "stalled":
                console_stalled_at = time.time()
            await asyncio.sleep(0.2)
        # Not before the threshold (no false alarm), and soon after it.
        for stalled_at in (box_stalled_at, console_stalled_at):
            assert stalled_at - last_t + 0.5 >= STALL_AFTER_S
            assert stalled_at - last_t <= STALL_AFTER_S + 5

        box.signal_group(run_dir, signal.SIGCONT)
        await wait_until(lambda: console.state.run_state == "running", what="recovery")
        assert box.status(run_dir, STALL_AFTER_S).data["state"] == "running"
    finally:
        follow.cancel()
        await transport.close()
    # The console never lost its place: one run, rising seqs, nothing rejected.
    seqs = console.live_seqs()
    assert seqs == sorted(set(seqs)) and not console.rejected
