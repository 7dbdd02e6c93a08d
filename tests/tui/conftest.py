"""Fixtures for the console's tests: a client key, the pct shim, an in-process asyncssh
server (per test, in the test's event loop) and one OpenSSH sshd shared by the session."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncssh
import pytest
import textual._wait as textual_wait

from dflash_train.protocol import Rejected, Reply, StatusLine, decode_reply
from dflash_train.stream.writer import StatusWriter
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.known_hosts import trust_host_key
from dflash_tui.sources.session import ConnectionState, Session
from dflash_tui.sources.state import RunState
from dflash_tui.sources.transport import SshTransport
from tests.sshd import (
    LOGIN,
    LOOPBACK,
    ClientKey,
    InProcessServer,
    OpenSshServer,
    make_client_key,
    make_shim_dir,
)

PCT_PREFIX = ("pct", "exec", "200", "--")

# Pilot's press() and pause() wait for the app to go idle: they sleep in 20 ms slices until
# one passes with under 1 ms of this process's CPU. Slices of 4 ms with under 0.2 ms (the
# same 5 % ratio) tell idle from busy alike and sit ~40 ms less after every key and
# pause; hundreds of those add up to minutes over the console and reliability tests. Set
# here, at import: every test that drives a Textual app imports this module (the
# reliability conftest reuses its fixtures), and the constants are read at each call.
textual_wait.SLEEP_GRANULARITY = 0.004
textual_wait.SLEEP_IDLE = textual_wait.SLEEP_GRANULARITY / 20


# A console test that hangs (an await that never returns) is ended by pytest-timeout after
# 600 s with the threads' stacks, which show only the idle event loop. Shortly before, the
# loop itself prints every task's stack: where each coroutine waits (captured, so it is in
# the failure's report).
HANG_REPORT_S = 540.0


@pytest.fixture(autouse=True)
def _hang_report(request: pytest.FixtureRequest) -> None:
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("_loop_task_dump")


@pytest.fixture
async def _loop_task_dump() -> AsyncIterator[None]:
    def dump() -> None:
        print(f"--- {HANG_REPORT_S:g} s into the test; its event loop's tasks:", file=sys.stderr)
        for task in asyncio.all_tasks():
            task.print_stack(file=sys.stderr)

    handle = asyncio.get_running_loop().call_later(HANG_REPORT_S, dump)
    try:
        yield
    finally:
        handle.cancel()


@pytest.fixture(scope="session")
def ssh_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ssh")


@pytest.fixture(scope="session")
def client_key(ssh_home: Path) -> ClientKey:
    return make_client_key(ssh_home)


@pytest.fixture(scope="session")
def shim_dir(ssh_home: Path) -> Path:
    return make_shim_dir(ssh_home)


@pytest.fixture(scope="session")
def openssh_server(
    ssh_home: Path, client_key: ClientKey, shim_dir: Path
) -> Iterator[OpenSshServer]:
    assert shutil.which("/usr/sbin/sshd"), (
        "OpenSSH server is required: apt-get install openssh-server"
    )
    server = OpenSshServer(ssh_home / "sshd", shim_dir)
    server.start(client_key)
    yield server
    server.stop()


@pytest.fixture
async def inproc_server(
    tmp_path: Path, client_key: ClientKey, shim_dir: Path
) -> AsyncIterator[InProcessServer]:
    workdir = tmp_path / "remote-cwd"
    workdir.mkdir()
    server = InProcessServer(asyncssh.generate_private_key("ssh-ed25519"), shim_dir, workdir)
    await server.start(client_key)
    yield server
    await server.close()


def trusted_known_hosts(path: Path, port: int, key: asyncssh.SSHKey) -> Path:
    trust_host_key(LOOPBACK, port, key, path)
    return path


def transport_to(
    port: int,
    key: ClientKey,
    known_hosts: Path,
    *,
    exec_prefix: tuple[str, ...] = PCT_PREFIX,
    jump: str | None = None,
    keepalive_interval: float = 2,
) -> SshTransport:
    return SshTransport(
        LOOPBACK,
        port=port,
        username=LOGIN,
        exec_prefix=exec_prefix,
        jump=jump,
        known_hosts=known_hosts,
        config_path=None,
        client_keys=[key.private_path],
        keepalive_interval=keepalive_interval,
        connect_timeout=5,
    )


# ---------------------------------------------------------------------------------------
# A real process appending to a status stream, as the trainer's monitor thread would.

WRITER_CODE = """
import sys, time
from pathlib import Path
from dflash_train.stream.writer import StatusWriter
path, run, count, interval = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
stop = Path(sys.argv[5]) if len(sys.argv) > 5 else None
writer = StatusWriter(path, run)
for i in range(count):
    if stop is not None and stop.exists():
        break
    writer.write("step", step=i, epoch=0, epoch_progress=i / count, loss=1.0, acc=0.5,
                 tau=2.0, lr=1e-4, grad_norm=1.0, tokens=i, ktok_s=1.0)
    time.sleep(interval)
"""


def start_stream_writer(
    run_dir: Path, run_id: str, count: int, interval: float, *, stop: Path | None = None
) -> subprocess.Popen[bytes]:
    """A process writing `count` step lines, one per `interval`; with `stop`, it ends early
    once that file exists (see stop_stream_writer), so a test paced by faults rather than
    by the clock never runs out of lines on a loaded machine."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", WRITER_CODE, str(run_dir / "status.jsonl"), run_id]
    argv += [str(count), str(interval)] + ([str(stop)] if stop is not None else [])
    return subprocess.Popen(argv)


def stop_stream_writer(writer: subprocess.Popen[bytes], stop: Path, run_dir: Path) -> int:
    """Ends a writer started with `stop` and returns how many lines it wrote."""
    stop.touch()
    assert writer.wait(60) == 0
    return len((run_dir / "status.jsonl").read_bytes().splitlines())


def write_steps(run_dir: Path, run_id: str, count: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = StatusWriter(run_dir / "status.jsonl", run_id)
    for i in range(count):
        writer.write(
            "step",
            step=i,
            epoch=0,
            epoch_progress=0.0,
            loss=1.0,
            acc=0.5,
            tau=2.0,
            lr=1e-4,
            grad_norm=1.0,
            tokens=i,
            ktok_s=1.0,
        )
    writer.close()


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight prompts answered by the tiny random target itself (the real `prepare`), made
    once for every console test that trains a real run on it."""
    out = tmp_path_factory.mktemp("tiny-data") / "data"
    done = subprocess.run(
        [sys.executable, "-m", "dflash_train", "prepare", "--target-model", "random:tiny",
         "--prompts", "builtin", "--out", str(out), "--samples", "8",
         "--max-new-tokens", "16", "--batch-size", "8"],
        capture_output=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    reply = decode_reply(done.stdout)
    assert isinstance(reply, Reply) and reply.ok, (reply, done.stderr[-2000:])
    return out


@pytest.fixture(params=["asyncssh", "openssh"])
def ssh_server(
    request: pytest.FixtureRequest,
    inproc_server: InProcessServer,
    openssh_server: OpenSshServer,
) -> InProcessServer | OpenSshServer:
    """Each SSH test runs against both servers."""
    return inproc_server if request.param == "asyncssh" else openssh_server


def server_key(server: InProcessServer | OpenSshServer) -> asyncssh.SSHKey:
    assert server.host_key is not None
    return server.host_key


@pytest.fixture
def ssh_transport(
    ssh_server: InProcessServer | OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> SshTransport:
    known = trusted_known_hosts(tmp_path / "known_hosts", ssh_server.port, server_key(ssh_server))
    return transport_to(ssh_server.port, client_key, known)


# ---------------------------------------------------------------------------------------
# A console's view of a session, for the session tests.

# The box side of the tests runs this interpreter: `PYTHON -m dflash_train`.
TRAINER_PYTHON = sys.executable
FAST_BACKOFF = Backoff(initial=0.05, cap=0.3)


async def wait_for(check: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'a condition'}")
        await asyncio.sleep(0.05)


class Watcher:
    """What a console would keep: every delivered line, the states, and a RunState."""

    def __init__(self) -> None:
        self.lines: list[StatusLine] = []
        self.rejected: list[Rejected] = []
        self.states: list[ConnectionState] = []
        self.state = RunState()

    def on_line(self, line: StatusLine) -> None:
        self.lines.append(line)
        self.state.apply(line)

    def session(self, transport: SshTransport, run_dir: Path | str, **kw: object) -> Session:
        return Session(
            transport,
            run_dir=str(run_dir),
            python=TRAINER_PYTHON,
            on_line=self.on_line,
            on_reject=self.rejected.append,
            on_connection=self.states.append,
            backoff=FAST_BACKOFF,
            **kw,  # type: ignore[arg-type]
        )

    def live_seqs(self) -> list[int]:
        return [ln.seq for ln in self.lines if not ln.get("history")]

    def reconnects(self) -> int:
        return sum(1 for s in self.states if s.status == "reconnecting")
