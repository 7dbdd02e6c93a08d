"""Fixtures of the reliability suite: the console area's loopback SSH servers (reused from
tests/tui/conftest.py), and one real training run shared by the tests that only observe or
poke it (stall, set, secrets, two consoles). The shared run is kept SIGSTOPped between its
users so it does not eat the two cores while other tests run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from dflash_train.protocol import Reply
from tests.reliability import box
from tests.reliability.console_side import BOX_PYTHON, ssh_transport, trusted
from tests.sshd import ClientKey, OpenSshServer
from tests.tui import conftest as tui_fixtures

# The console area's SSH fixtures, made available in this folder.
ssh_home = tui_fixtures.ssh_home
client_key = tui_fixtures.client_key
shim_dir = tui_fixtures.shim_dir
inproc_server = tui_fixtures.inproc_server
openssh_server = tui_fixtures.openssh_server

WANDB_SECRET = "wandb-SECRET-3f9c1a7e5d2b4c6a8e0f1b3d5c7a9e2f4b6d8a0c"
PASSPHRASE = "ssh-PASSPHRASE-correct-horse-battery-staple-71"


@dataclass(frozen=True)
class LiveRun:
    """A real trainer launched through a console session over OpenSSH with an agent-held,
    passphrase-protected key and a W&B key in its environment."""

    run_dir: Path
    launch_reply: Reply
    server: OpenSshServer
    known_hosts: Path
    agent_socket: str

    def pause(self) -> None:
        box.signal_group(self.run_dir, signal.SIGSTOP)

    def resume(self) -> None:
        box.signal_group(self.run_dir, signal.SIGCONT)


def _start_agent(directory: Path, key: ClientKey) -> tuple[int, str]:
    """A real ssh-agent holding the client key, which is stored on disk encrypted with
    PASSPHRASE: the console never sees the passphrase, only the agent does."""
    encrypted = directory / "id_ed25519_encrypted"
    asyncssh.read_private_key(str(key.private_path)).write_private_key(
        # PKCS#8: encrypted with `cryptography` (the OpenSSH format would need bcrypt).
        str(encrypted),
        format_name="pkcs8-pem",
        passphrase=PASSPHRASE,
    )
    sock = str(directory / "agent.sock")
    proc = subprocess.run(
        ["ssh-agent", "-a", sock, "-s"], capture_output=True, text=True, check=True
    )
    pid = int(proc.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])

    async def add() -> None:
        agent = await asyncssh.connect_agent(sock)
        assert agent is not None
        await agent.add_keys([str(encrypted)], passphrase=PASSPHRASE)
        agent.close()

    asyncio.run(add())
    return pid, sock


def restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@pytest.fixture(scope="session")
def shared_run(
    tmp_path_factory: pytest.TempPathFactory,
    prepared_data_dir: Path,
    smollm2_spec: str,
    openssh_server: OpenSshServer,
    client_key: ClientKey,
) -> Iterator[LiveRun]:
    from dflash_tui.sources.session import Session

    root = tmp_path_factory.mktemp("shared-run")
    run_dir = root / "run"
    agent_pid, agent_sock = _start_agent(root, client_key)
    assert openssh_server.host_key is not None
    known = trusted(root / "known_hosts", openssh_server.port, openssh_server.host_key)
    env = {
        **box.trainer_env(),
        "WANDB_API_KEY": WANDB_SECRET,
        # No network here: fail W&B's online init fast; the run must go on without it.
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_INIT_TIMEOUT": "5",
    }
    args = box.tiny_train_args(
        smollm2_spec,
        prepared_data_dir,
        "--pipeline", "async",
        "--epochs", "1000",
        "--save-every", "4",
        "--keep-checkpoints", "2",
        "--hs-queue-depth", "6",
        "--hs-min-ready", "2",
        "--wandb-project", "dflash-reliability",
    )  # fmt: skip

    async def launch() -> Reply:
        os.environ["SSH_AUTH_SOCK"] = agent_sock
        transport = ssh_transport(openssh_server.port, known, None)
        session = Session(
            transport,
            run_dir=str(run_dir),
            python=BOX_PYTHON,
            read_only=False,
            on_line=lambda line: None,
            launch_wait=200,
        )
        try:
            return await session.launch(args, env=env)
        finally:
            await transport.close()
            restore_env("SSH_AUTH_SOCK", previous_sock)

    previous_sock = os.environ.get("SSH_AUTH_SOCK")
    try:
        reply = asyncio.run(launch())
        assert reply.ok, reply
        live = LiveRun(run_dir, reply, openssh_server, known, agent_sock)
        live.pause()
        yield live
    finally:
        box.kill_run(run_dir)
        os.kill(agent_pid, signal.SIGTERM)


@pytest.fixture
def live_run(shared_run: LiveRun) -> Iterator[LiveRun]:
    """The shared run, training for the length of one test."""
    shared_run.resume()
    try:
        yield shared_run
    finally:
        shared_run.pause()
