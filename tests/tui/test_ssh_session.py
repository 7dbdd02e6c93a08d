"""Session over real SSH on loopback (asyncssh server and OpenSSH sshd, through the pct shim):
the follow survives repeated server-side drops with no gap and no duplicate, a watch-mode
session sends nothing mutating, and injection strings typed into every field stay inert."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest

from dflash_tui.sources.session import InputError, ReadOnlyError, Session
from dflash_tui.sources.transport import HostKeyUnknown, SshTransport
from tests.sshd import ClientKey, InProcessServer, OpenSshServer
from tests.tui.conftest import (
    PCT_PREFIX,
    Watcher,
    server_key,
    start_stream_writer,
    stop_stream_writer,
    transport_to,
    trusted_known_hosts,
    wait_for,
)

Server = InProcessServer | OpenSshServer


async def test_follow_survives_repeated_drops_without_gap_or_duplicate(
    ssh_server: Server, ssh_transport: SshTransport, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    stop = tmp_path / "stop-writing"
    # The writer goes on until the drops are done, however long reconnects take here.
    writer = start_stream_writer(run_dir, "dropped", 100_000, 0.01, stop=stop)
    watcher = Watcher()
    session = watcher.session(ssh_transport, run_dir, read_only=True, history_points=0)
    follow = asyncio.create_task(session.follow())
    try:
        for drop in range(1, 5):
            seen = len(watcher.lines)
            await wait_for(lambda s=seen: len(watcher.lines) > s + 10, what="lines flowing")
            assert ssh_server.drop_connections() >= 1
            await wait_for(lambda d=drop: watcher.reconnects() >= d, what="reconnecting")
        seen = len(watcher.lines)
        await wait_for(lambda: len(watcher.lines) > seen + 10, what="lines after the last drop")
        total = stop_stream_writer(writer, stop, run_dir)
        await wait_for(lambda: len(watcher.lines) >= total, what="every line")
        await wait_for(lambda: watcher.states[-1].status == "connected", what="reconnected")
        await asyncio.sleep(0.3)  # a duplicate would arrive now
    finally:
        follow.cancel()
        writer.kill()
        writer.wait()
    assert watcher.live_seqs() == list(range(total))
    assert session.cursor == ("dropped", total - 1)
    assert watcher.state.step == total - 1 and not watcher.rejected
    statuses = [s.status for s in watcher.states]
    assert statuses.count("reconnecting") >= 4 and statuses[-1] == "connected"
    resumed = [c for c in ssh_server.received() if "--from-seq" in c and str(run_dir) in c]
    assert len(resumed) >= 4 and all("--run dropped" in c for c in resumed)
    await ssh_transport.close()


async def test_watch_mode_sends_nothing_mutating(
    ssh_server: Server, ssh_transport: SshTransport, tmp_path: Path
) -> None:
    watcher = Watcher()
    session = watcher.session(ssh_transport, tmp_path / "run", read_only=True)
    before = ssh_server.received()
    refused = [
        lambda: session.launch(["--epochs", "1"]),
        lambda: session.stop(timeout=5),
        lambda: session.restart(fresh=True),
        lambda: session.restart(overrides={"lr": "1e-4"}),
        lambda: session.set_setting("hs_min_ready", "3"),
    ]
    for call in refused:
        with pytest.raises(ReadOnlyError):
            await call()
    assert ssh_server.received() == before
    reply = await session.status()  # watching may still ask
    assert reply.command == "status"
    sent = ssh_server.received()[len(before) :]
    assert len(sent) == 1 and " status " in sent[0]
    for word in ("launch", "stop", "restart", " set "):
        assert not any(word in c for c in ssh_server.received())
    await ssh_transport.close()


async def test_injection_in_every_field_is_inert_or_refused(
    ssh_server: Server, ssh_transport: SshTransport, tmp_path: Path
) -> None:
    canary = tmp_path / "CANARY"
    evils = [
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"' ; touch {canary} ; '",
        f'" ; touch {canary} ; "',
        f"& touch {canary} | touch {canary}",
    ]
    watcher = Watcher()
    # Every field that reaches the box does so as argv words: all the strings at once.
    run_dir = f"{tmp_path}/run {' '.join(evils)}"
    session = watcher.session(ssh_transport, run_dir, read_only=False, launch_wait=5)
    before = len(ssh_server.received())
    replies = [
        await session.status(),
        await session.launch(["--data-dir", *evils]),
        await session.stop(timeout=1),
        await session.restart(overrides={f"opt{i}": evil for i, evil in enumerate(evils)}),
    ]
    for reply in replies:
        assert not reply.ok and reply.error  # the run dir does not exist: refused by the box
    sent = ssh_server.received()[before:]
    assert len(sent) == 4
    for command in sent:
        words = shlex.split(command)
        assert words[: len(PCT_PREFIX)] == list(PCT_PREFIX) and run_dir in words
    for command in (sent[1], sent[3]):
        assert all(evil in shlex.split(command) for evil in evils)
    # What cannot be a plain word is refused before sending.
    for evil in evils:
        with pytest.raises(InputError):
            await session.set_setting("hs_min_ready", evil)
        with pytest.raises(InputError):
            await session.set_setting(evil, "3")
        with pytest.raises(InputError):
            await session.launch(["--lr", f"1e-4\n{evil}"])
        with pytest.raises(InputError, match="run_dir: contains a newline"):
            watcher.session(ssh_transport, f"{tmp_path}\n{evil}", read_only=False)
    assert len(ssh_server.received()) == before + 4
    # The interpreter path is an argv word too.
    odd_python = Session(
        ssh_transport,
        run_dir=str(tmp_path),
        python=f"/nonexistent/python{evils[0]}",
        read_only=False,
        on_line=watcher.on_line,
    )
    reply = await odd_python.status()
    assert not reply.ok and reply.error_code == "no_trainer"  # exit 127: no such file
    assert not canary.exists()
    await ssh_transport.close()


async def test_unknown_host_key_fails_the_follow_and_sends_nothing(
    ssh_server: Server, client_key: ClientKey, tmp_path: Path
) -> None:
    transport = transport_to(ssh_server.port, client_key, tmp_path / "known_hosts")
    watcher = Watcher()
    session = watcher.session(transport, tmp_path, read_only=False)
    before = ssh_server.received()
    await asyncio.wait_for(session.follow(), 30)
    failed = watcher.states[-1]
    assert failed.status == "failed" and isinstance(failed.error, HostKeyUnknown)
    assert failed.error.fingerprint in (failed.reason or "")
    reply = await session.set_setting("hs_min_ready", "3")
    assert not reply.ok and reply.error_code == "host_key_unknown"
    assert ssh_server.received() == before


async def test_a_silent_network_is_noticed_by_keepalive(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    writer = start_stream_writer(run_dir, "frozen", 300, 0.02)
    known = trusted_known_hosts(
        tmp_path / "known_hosts", openssh_server.port, server_key(openssh_server)
    )
    transport = transport_to(openssh_server.port, client_key, known, keepalive_interval=1)
    watcher = Watcher()
    session = watcher.session(transport, run_dir, read_only=True, history_points=0)
    follow = asyncio.create_task(session.follow())
    frozen: list[int] = []
    try:
        await wait_for(lambda: len(watcher.lines) > 20, what="lines flowing")
        # The server stops answering but the TCP connection stays open: no error, no EOF.
        frozen = openssh_server.freeze_connections()
        assert frozen
        await wait_for(lambda: watcher.reconnects() >= 1, 20, "keepalive noticing")
        await wait_for(lambda: len(watcher.lines) >= 300, 30, "every line")
    finally:
        follow.cancel()
        openssh_server.thaw_and_kill(frozen)
        writer.kill()
        writer.wait()
    assert watcher.live_seqs() == list(range(300))
    await transport.close()
