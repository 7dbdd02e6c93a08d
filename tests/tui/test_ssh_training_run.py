"""A real CPU training run of the real trainer with the real SmolLM2 target, driven over SSH
on loopback (asyncssh server and OpenSSH sshd) through the pct shim, exactly as the console
drives a box: launch, watch steps arrive, change hs_min_ready live and see it acknowledged,
lose the connection repeatedly mid-stream, restart from the checkpoint, stop. Nothing is
delivered twice and no line is missed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from dflash_train.config.recipes import CPU_TINY
from dflash_train.protocol import StatusLine, decode_line
from dflash_train.rundir import lock_is_held
from dflash_tui.sources.transport import SshTransport
from tests.sshd import InProcessServer, OpenSshServer
from tests.tui.conftest import Watcher, wait_for

TINY_TRAINER = [
    *CPU_TINY.argv(),
    "--max-steps", "100000",
    "--save-every", "2",
    "--keep-checkpoints", "2",
    "--hs-queue-depth", "8",
    "--hs-min-ready", "2",
]  # fmt: skip


def trainer_env() -> dict[str, str]:
    # The box hands the trainer only PATH, HOME and LANG: the rest is given explicitly.
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if os.environ.get("DFLASH_CACHE_DIR"):
        env["DFLASH_CACHE_DIR"] = os.environ["DFLASH_CACHE_DIR"]
    return env


def stream_on_disk(run_dir: Path) -> list[StatusLine]:
    lines = []
    for raw in (run_dir / "status.jsonl").read_bytes().splitlines():
        decoded = decode_line(raw)
        assert isinstance(decoded, StatusLine), decoded
        lines.append(decoded)
    return lines


def steps(watcher: Watcher) -> int:
    return sum(1 for ln in watcher.lines if ln.kind == "step" and not ln.get("history"))


async def test_real_run_over_ssh(
    ssh_server: InProcessServer | OpenSshServer,
    ssh_transport: SshTransport,
    prepared_data_dir: Path,
    smollm2_spec: str,
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    watcher = Watcher()
    session = watcher.session(
        ssh_transport, run_dir, read_only=False, history_points=50, launch_wait=300
    )
    args = ["--target-model", smollm2_spec, "--data-dir", str(prepared_data_dir), *TINY_TRAINER]
    follow: asyncio.Task[None] | None = None
    try:
        reply = await session.launch(args, env=trainer_env())
        assert reply.ok, reply
        follow = asyncio.create_task(session.follow())
        await wait_for(lambda: steps(watcher) >= 1, 120, "the first step")
        state = watcher.state
        assert state.run_state == "running" and state.run_id is not None
        assert state.total_steps is not None and state.epochs is not None
        assert state.latest("loss") is not None and state.settings["hs_min_ready"] == 2
        status = await session.status()
        assert status.ok and status.data["state"] == "running", status
        assert status.data["run_id"] == state.run_id

        reply = await session.set_setting("hs_min_ready", "3")
        assert reply.ok, reply
        await wait_for(
            lambda: any(e.code == "control_applied" for e in state.events), 60, "the ack"
        )
        assert state.settings["hs_min_ready"] == 3

        for drop in range(1, 4):
            assert ssh_server.drop_connections() >= 1
            await wait_for(lambda d=drop: watcher.reconnects() >= d, 30, "reconnecting")
            before = len(watcher.lines)
            # Any new line (steps, queue and GPU ticks, heartbeats) shows the resumed tail.
            await wait_for(lambda b=before: len(watcher.lines) > b, 60, "lines after a drop")

        first_id = state.run_id
        await wait_for(lambda: state.checkpoint is not None, 120, "a checkpoint")
        reply = await session.restart()
        assert reply.ok, reply
        await wait_for(
            lambda: any(ln.kind == "run_start" and ln.get("resumed_from") for ln in watcher.lines),
            120,
            "the resumed run_start",
        )
        resumed = [ln for ln in watcher.lines if ln.kind == "run_start"][-1]
        assert resumed.run == first_id and resumed["start_step"] >= 2
        assert state.run_state == "running" and state.step >= resumed["start_step"]

        reply = await session.stop(timeout=60)
        assert reply.ok, reply
        await wait_for(lambda: state.run_state == "stopped", 60, "run_end")
        assert state.end is not None and state.end["reason"] == "signal"
    finally:
        if follow is not None:
            follow.cancel()
        if lock_is_held(run_dir / "run.lock"):
            subprocess.run(
                [sys.executable, "-m", "dflash_train", "stop", str(run_dir), "--timeout", "20"],
                capture_output=True,
                timeout=60,
            )
        await ssh_transport.close()

    # Everything past the history summary arrived exactly once, in order.
    history_end = next(ln for ln in watcher.lines if ln.get("code") == "history_end")
    live = [(ln.run, ln.seq) for ln in watcher.lines if not ln.get("history")]
    on_disk = [(ln.run, ln.seq) for ln in stream_on_disk(run_dir) if ln.seq > history_end.seq]
    assert live == on_disk
    assert watcher.reconnects() >= 3 and not watcher.rejected
