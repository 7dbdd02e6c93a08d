"""Fault: the SSH connection dies while the console follows a live stream, again and again:
the server closes it (asyncssh aborts the connection; OpenSSH's per-connection sshd is
SIGKILLed), or the network drops it (a loopback proxy sends RSTs both ways, or swallows
every byte so only the client's keepalive notices). Asserted: the console reconnects each
time, resumes from its cursor, and the seqs it received have no gap and no duplicate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from tests.reliability.console_side import Recorder, ssh_transport, trusted, wait_until
from tests.reliability.drop_proxy import DropProxy
from tests.sshd import ClientKey, InProcessServer, OpenSshServer
from tests.tui.conftest import start_stream_writer, stop_stream_writer

DROPS = 6
MAX_LINES = 100_000
INTERVAL_S = 0.01


@dataclass
class Route:
    """One way to the box and the fault that cuts it."""

    port: int
    host_key: asyncssh.SSHKey
    cut: Callable[[], int]
    received: Callable[[], list[str]]


@pytest.fixture
async def proxy(inproc_server: InProcessServer) -> AsyncIterator[DropProxy]:
    drop = DropProxy(inproc_server.port)
    await drop.start()
    yield drop
    await drop.close()


async def follow_through_drops(
    way: Route, client_key: ClientKey, tmp_path: Path, drops: int, *, keepalive: float = 2
) -> Recorder:
    run_dir = tmp_path / "run"
    run = "dropped"
    stop = tmp_path / "stop-writing"
    # The writer goes on until the drops are done, however long reconnects take here: a
    # writer that ran out first left the last reconnect with nothing to resume.
    writer = start_stream_writer(run_dir, run, MAX_LINES, INTERVAL_S, stop=stop)
    known = trusted(tmp_path / "known_hosts", way.port, way.host_key)
    transport = ssh_transport(way.port, known, client_key, keepalive=keepalive)
    recorder = Recorder()
    session = recorder.session(transport, run_dir, read_only=True, history_points=0)
    follow = asyncio.create_task(session.follow())
    try:
        for drop in range(1, drops + 1):
            seen = len(recorder.lines)
            await wait_until(lambda s=seen: len(recorder.lines) > s + 5, what="lines flowing")
            assert way.cut() >= 1
            await wait_until(lambda d=drop: recorder.count("reconnecting") >= d, what="a retry")
        seen = len(recorder.lines)
        await wait_until(lambda: len(recorder.lines) > seen + 5, what="lines after the last cut")
        lines = stop_stream_writer(writer, stop, run_dir)
        await wait_until(lambda: len(recorder.lines) >= lines, timeout=90, what="every line")
        await asyncio.sleep(0.5)  # a duplicate would arrive now
    finally:
        follow.cancel()
        writer.kill()
        writer.wait()
        await transport.close()
    # No gap, no duplicate, nothing but good lines, and the cursor at the end.
    assert recorder.live_seqs() == list(range(lines))
    assert session.cursor == (run, lines - 1)
    assert not recorder.rejected
    assert recorder.state.step == lines - 1
    assert recorder.count("reconnecting") >= drops and recorder.states[-1].status == "connected"
    # Every reconnect resumed from the cursor rather than from the start.
    resumed = [c for c in way.received() if "--from-seq" in c and str(run_dir) in c]
    assert len(resumed) >= drops and all(f"--run {run}" in c for c in resumed)
    return recorder


async def test_server_side_close_asyncssh(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    way = Route(
        inproc_server.port,
        inproc_server.host_key,
        inproc_server.drop_connections,
        inproc_server.received,
    )
    await follow_through_drops(way, client_key, tmp_path, DROPS)


async def test_server_side_close_openssh(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    way = Route(
        openssh_server.port,
        openssh_server.host_key,
        openssh_server.drop_connections,
        openssh_server.received,
    )
    await follow_through_drops(way, client_key, tmp_path, DROPS)


async def test_network_reset_through_proxy(
    inproc_server: InProcessServer, proxy: DropProxy, client_key: ClientKey, tmp_path: Path
) -> None:
    way = Route(proxy.port, inproc_server.host_key, proxy.reset_all, inproc_server.received)
    await follow_through_drops(way, client_key, tmp_path, DROPS)
    assert proxy.resets >= DROPS and proxy.accepted >= DROPS + 1


async def test_network_blackhole_through_proxy(
    inproc_server: InProcessServer, proxy: DropProxy, client_key: ClientKey, tmp_path: Path
) -> None:
    """A silent dead link: nothing is closed, every byte is lost. Only the console's SSH
    keepalive (1 s here) can notice; then it reconnects through a fresh connection."""
    way = Route(proxy.port, inproc_server.host_key, proxy.blackhole_all, inproc_server.received)
    await follow_through_drops(way, client_key, tmp_path, 2, keepalive=1)
    assert proxy.blackholes >= 2 and proxy.accepted >= 3
