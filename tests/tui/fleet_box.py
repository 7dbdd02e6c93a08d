"""The box side of the fleet tests: a process that holds a run dir's run.lock (the trainer's
liveness test) and appends a run_start and then steps and GPU ticks to its stream, at a
steady pace, until it is ended; and the profiles and transports that point at it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dflash_tui.sources.profiles import Profile
from dflash_tui.sources.transport import SshTransport, Transport
from tests.sshd import LOGIN, LOOPBACK, ClientKey

LIVE_RUN_CODE = """
import sys, time
from pathlib import Path
from dflash_train.rundir import RunLock
from dflash_train.stream.writer import StatusWriter
run_dir, run = Path(sys.argv[1]), sys.argv[2]
interval, temp = float(sys.argv[3]), float(sys.argv[4])
with RunLock(run_dir / "run.lock"):
    writer = StatusWriter(run_dir / "status.jsonl", run)
    writer.write("run_start", config={"epochs": 3}, topology={}, dataset={},
                 batches_per_epoch=1000, total_steps=3000, pid=0, host="box")
    step = 0
    while True:
        writer.write("step", step=step, epoch=step // 1000, epoch_progress=(step % 1000) / 1000,
                     loss=3.0 - step / 1000, acc=0.5, tau=2.5, lr=1e-4, grad_norm=1.0,
                     tokens=step, ktok_s=12.5)
        if step % 5 == 0:
            writer.write("gpu", available=True, reason=None, gpus=[{"index": 0, "name": "cpu",
                "role": "drafter", "util": 50.0, "mem_used": 1.0, "mem_total": 2.0,
                "power_w": 1.0, "power_limit_w": 2.0, "temp_c": temp}])
        step += 1
        time.sleep(interval)
"""


def start_live_run(
    run_dir: Path, run_id: str, *, interval: float = 0.2, temp_c: float = 60.0
) -> subprocess.Popen[bytes]:
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", LIVE_RUN_CODE, str(run_dir), run_id, str(interval), str(temp_c)],
        stdin=subprocess.DEVNULL,
    )


def ssh_profile(name: str, port: int, run_dir: Path, **extra: object) -> Profile:
    return Profile(
        name,
        host=LOOPBACK,
        port=port,
        user=LOGIN,
        run_dir=str(run_dir),
        python=sys.executable,
        **extra,  # type: ignore[arg-type]
    )


def transports_to_loopback(key: ClientKey, known_hosts: Path):  # type: ignore[no-untyped-def]
    """The fleet's transport factory for the loopback servers: the test's key and
    known_hosts, no ~/.ssh/config."""

    def make(profile: Profile) -> Transport:
        assert profile.host is not None and not profile.command_prefix()
        return SshTransport(
            profile.host,
            port=profile.port,
            username=profile.user,
            known_hosts=known_hosts,
            config_path=None,
            client_keys=[key.private_path],
            keepalive_interval=2,
            connect_timeout=3,
        )

    return make
