"""SshTransport over real SSH on loopback, against the in-process asyncssh server and
OpenSSH's sshd, with commands going through the pct shim: one quoting layer, complete
lines, timeouts, drops and lazy reconnects, host-key refusal before anything is sent."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import asyncssh
import pytest

from dflash_tui.sources.known_hosts import trust_host_key
from dflash_tui.sources.transport import (
    AuthenticationFailed,
    CommandTimeout,
    HostKeyUnknown,
    SshTransport,
    TransportError,
)
from tests.sshd import LOGIN, LOOPBACK, ClientKey, InProcessServer, OpenSshServer, make_client_key
from tests.tui.conftest import PCT_PREFIX, server_key, transport_to, trusted_known_hosts

Server = InProcessServer | OpenSshServer


def evil_strings(canary: Path) -> list[str]:
    return [
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"' ; touch {canary} ; '",
        f'" ; touch {canary} ; "',
        f"&& touch {canary} || touch {canary}",
        f"| touch {canary}",
        "$HOME ~ * ?",
        "",
    ]


async def pid_gone(pid: int, timeout: float = 10) -> bool:
    for _ in range(int(timeout / 0.05)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_every_word_arrives_inert_through_one_quoting_layer(
    ssh_server: Server, ssh_transport: SshTransport, tmp_path: Path
) -> None:
    canary = tmp_path / "CANARY"
    words = evil_strings(canary)
    argv = ["printf", "%s\\n", *words]
    result = await ssh_transport.run(argv, timeout=20)
    assert result.rc == 0, result.stderr
    assert result.stdout.decode().split("\n")[:-1] == words
    assert ssh_server.received()[-1] == shlex.join([*PCT_PREFIX, *argv])
    assert not canary.exists()
    await ssh_transport.close()


async def test_stream_gives_complete_lines_and_how_it_ended(ssh_transport: SshTransport) -> None:
    script = "printf 'one\\ntwo\\npartial'; echo went wrong >&2; exit 3"
    async with ssh_transport.stream(["sh", "-c", script]) as lines:
        assert [line async for line in lines] == [b"one", b"two"]
    assert lines.partial_at_eof == b"partial"
    assert lines.end is not None
    assert lines.end.returncode == 3 and lines.end.stderr_tail == b"went wrong\n"
    await ssh_transport.close()


async def test_leaving_a_stream_ends_the_remote_command(
    ssh_transport: SshTransport, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; while :; do echo tick; sleep 0.05; done"
    async with ssh_transport.stream(["sh", "-c", script]) as lines:
        async for _ in lines:
            break
    assert await pid_gone(int(pid_file.read_text()))
    # The one connection is still good for the next command.
    assert (await ssh_transport.run(["echo", "ok"], timeout=20)).stdout == b"ok\n"
    await ssh_transport.close()


async def test_run_timeout_gives_up_on_the_command(ssh_transport: SshTransport) -> None:
    # Connected first: what is timed is the command, not the handshake.
    assert (await ssh_transport.run(["echo", "up"], timeout=20)).stdout == b"up\n"
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(CommandTimeout, match="sleep 30"):
        await ssh_transport.run(["sleep", "30"], timeout=0.5)
    assert loop.time() - started < 5
    assert (await ssh_transport.run(["echo", "next"], timeout=20)).stdout == b"next\n"
    await ssh_transport.close()


async def test_reconnects_lazily_after_the_server_drops_it(
    ssh_server: Server, ssh_transport: SshTransport
) -> None:
    assert (await ssh_transport.run(["echo", "1"], timeout=20)).rc == 0
    assert ssh_server.drop_connections() >= 1
    await asyncio.sleep(0.2)
    assert (await ssh_transport.run(["echo", "2"], timeout=20)).stdout == b"2\n"
    await ssh_transport.close()


async def test_a_drop_mid_stream_raises_transport_error(
    ssh_server: Server, ssh_transport: SshTransport
) -> None:
    script = "while :; do echo tick; sleep 0.05; done"
    got = 0
    with pytest.raises(TransportError) as info:
        async with ssh_transport.stream(["sh", "-c", script]) as lines:
            async for _ in lines:
                got += 1
                if got == 3:
                    ssh_server.drop_connections()
    assert info.value.retryable
    await ssh_transport.close()


async def test_unknown_host_key_is_refused_before_anything_is_sent(
    ssh_server: Server, client_key: ClientKey, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    transport = transport_to(ssh_server.port, client_key, known)
    before = ssh_server.received()
    with pytest.raises(HostKeyUnknown) as info:
        await transport.run(["touch", str(tmp_path / "CANARY")], timeout=20)
    exc = info.value
    assert (exc.host, exc.port, exc.changed) == (LOOPBACK, ssh_server.port, False)
    assert exc.fingerprint == server_key(ssh_server).get_fingerprint("sha256")
    assert exc.fingerprint in str(exc) and not exc.retryable
    assert ssh_server.received() == before
    assert not (tmp_path / "CANARY").exists() and not known.exists()
    # The operator says yes: the key is appended and the same transport now connects.
    assert exc.key is not None and exc.known_hosts_path == known
    trust_host_key(exc.host, exc.port, exc.key, exc.known_hosts_path)
    assert (await transport.run(["echo", "trusted"], timeout=20)).stdout == b"trusted\n"
    await transport.close()


async def test_changed_host_key_is_refused(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    known = trusted_known_hosts(tmp_path / "known_hosts", inproc_server.port, impostor)
    transport = transport_to(inproc_server.port, client_key, known)
    with pytest.raises(HostKeyUnknown, match="CHANGED") as info:
        await transport.connect()
    assert info.value.changed
    assert inproc_server.received() == []


def test_known_hosts_none_is_not_accepted() -> None:
    with pytest.raises(ValueError, match="known_hosts"):
        SshTransport("box", known_hosts=None)  # type: ignore[arg-type]


async def test_wrong_client_key_is_a_final_error(ssh_server: Server, tmp_path: Path) -> None:
    stranger = make_client_key(tmp_path)
    known = trusted_known_hosts(tmp_path / "known_hosts", ssh_server.port, server_key(ssh_server))
    transport = transport_to(ssh_server.port, stranger, known)
    with pytest.raises(AuthenticationFailed) as info:
        await transport.run(["echo"], timeout=20)
    assert not info.value.retryable


async def test_ssh_config_alias_and_identity_file(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpubox\n  HostName {LOOPBACK}\n  Port {openssh_server.port}\n"
        f"  User {LOGIN}\n  IdentityFile {client_key.private_path}\n"
    )
    known = tmp_path / "known_hosts"
    transport = SshTransport(
        "gpubox", exec_prefix=PCT_PREFIX, known_hosts=known, config_path=config
    )
    with pytest.raises(HostKeyUnknown) as info:
        await transport.connect()
    # The alias resolves to the real address: that is what gets trusted.
    assert (info.value.host, info.value.port) == (LOOPBACK, openssh_server.port)
    assert info.value.key is not None
    trust_host_key(info.value.host, info.value.port, info.value.key, known)
    assert (await transport.run(["echo", "alias"], timeout=20)).stdout == b"alias\n"
    await transport.close()


async def test_jump_host(
    openssh_server: OpenSshServer,
    inproc_server: InProcessServer,
    client_key: ClientKey,
    tmp_path: Path,
) -> None:
    known = tmp_path / "known_hosts"
    trusted_known_hosts(known, openssh_server.port, server_key(openssh_server))
    trusted_known_hosts(known, inproc_server.port, server_key(inproc_server))
    transport = transport_to(
        inproc_server.port,
        client_key,
        known,
        jump=f"{LOGIN}@{LOOPBACK}:{openssh_server.port}",
    )
    assert f"via {LOGIN}@" in transport.description
    assert (await transport.run(["echo", "hop"], timeout=20)).stdout == b"hop\n"
    assert inproc_server.received() == [shlex.join([*PCT_PREFIX, "echo", "hop"])]
    await transport.close()


async def test_proxyjump_from_ssh_config_is_checked_against_our_known_hosts(
    openssh_server: OpenSshServer,
    inproc_server: InProcessServer,
    client_key: ClientKey,
    tmp_path: Path,
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host box\n  HostName {LOOPBACK}\n  Port {inproc_server.port}\n"
        f"  ProxyJump {LOGIN}@{LOOPBACK}:{openssh_server.port}\n"
        # The hop is looked up in the config too, as OpenSSH does.
        f"Host *\n  User {LOGIN}\n  IdentityFile {client_key.private_path}\n"
    )
    known = trusted_known_hosts(
        tmp_path / "known_hosts", inproc_server.port, server_key(inproc_server)
    )
    transport = SshTransport("box", exec_prefix=PCT_PREFIX, known_hosts=known, config_path=config)
    # The hop's key is not trusted yet: the refusal names the hop, not the box.
    with pytest.raises(HostKeyUnknown) as info:
        await transport.connect()
    assert info.value.port == openssh_server.port
    assert info.value.fingerprint == server_key(openssh_server).get_fingerprint("sha256")
    assert inproc_server.received() == []
    assert info.value.key is not None
    trust_host_key(info.value.host, info.value.port, info.value.key, known)
    assert (await transport.run(["echo", "hopped"], timeout=20)).stdout == b"hopped\n"
    assert inproc_server.received() == [shlex.join([*PCT_PREFIX, "echo", "hopped"])]
    await transport.close()


async def test_one_connection_carries_every_command(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    known = trusted_known_hosts(tmp_path / "kh", inproc_server.port, server_key(inproc_server))
    transport = transport_to(inproc_server.port, client_key, known)
    results = await asyncio.gather(*(transport.run(["echo", str(i)], timeout=20) for i in range(3)))
    assert [r.stdout for r in results] == [b"0\n", b"1\n", b"2\n"]
    async with transport.stream(["echo", "streamed"]) as lines:
        assert [line async for line in lines] == [b"streamed"]
    assert inproc_server.connections_accepted == 1
    await transport.close()
