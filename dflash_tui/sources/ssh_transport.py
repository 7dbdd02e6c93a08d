"""SshTransport: runs the trainer's commands on a box over one reused asyncssh connection,
with host keys always checked against known_hosts, keepalives to notice a dead network,
and a lazy reconnect after a drop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncssh

from dflash_tui.sources import known_hosts as trust
from dflash_tui.sources.deadline import within
from dflash_tui.sources.destination import check_destination, split_jump
from dflash_tui.sources.line_stream import LineStream, StreamEnd, drain_tail, last_bytes
from dflash_tui.sources.transport_types import (
    DEFAULT,
    STOP_GRACE_S,
    AuthenticationFailed,
    CommandResult,
    CommandTimeout,
    DestinationRefused,
    HostKeyUnknown,
    TransportError,
    UseDefault,
    describe_prefix,
)

SSH_ERRORS = (asyncssh.Error, OSError, EOFError)


class SshTransport:
    """Runs commands on a box over one asyncssh connection, opened lazily and reopened
    lazily after a drop. Host keys are always checked against known_hosts."""

    def __init__(
        self,
        host: str,
        *,
        port: int | None = None,
        username: str | None = None,
        exec_prefix: Sequence[str] = (),
        jump: str | None = None,
        known_hosts: str | os.PathLike[str] | UseDefault = DEFAULT,
        config_path: str | os.PathLike[str] | UseDefault | None = DEFAULT,
        client_keys: Sequence[str | os.PathLike[str]] | UseDefault = DEFAULT,
        keepalive_interval: float = 15,
        connect_timeout: float = 10,
    ) -> None:
        if known_hosts is None:
            raise ValueError("known_hosts: None would switch host-key checking off; give a path")
        check_destination("host", host)
        if username is not None:
            check_destination("user", username)
        if jump is not None:
            check_destination("jump", jump)
        self.host = host
        self.port = port
        self.username = username
        self.exec_prefix = tuple(exec_prefix)
        self.jump = jump
        self.known_hosts_path = trust.resolve_path(None if known_hosts is DEFAULT else known_hosts)
        self._config = config_path
        self._client_keys = client_keys
        self.keepalive_interval = keepalive_interval
        self.connect_timeout = connect_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jump_conns: list[asyncssh.SSHClientConnection] = []
        self._lock = asyncio.Lock()
        where = f"{username + '@' if username else ''}{host}{f':{port}' if port else ''}"
        via = f" via {jump}" if jump else ""
        self.description = where + via + describe_prefix(self.exec_prefix)

    def command_line(self, argv: Sequence[str]) -> str:
        """The one string the remote login shell parses: every word quoted exactly once."""
        return shlex.join([*self.exec_prefix, *argv])

    def _options(self, username: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {
            # Reloaded on every connect so a key trusted a moment ago counts.
            "known_hosts": trust.load_known_hosts(self.known_hosts_path),
            "keepalive_interval": self.keepalive_interval,
            "connect_timeout": self.connect_timeout,
        }
        if self._config is not DEFAULT:
            options["config"] = None if self._config is None else [str(self._config)]
        if self._client_keys is not DEFAULT:
            options["client_keys"] = [str(k) for k in self._client_keys]
        if username is not None:
            options["username"] = username
        return options

    async def connect(self) -> None:
        await self._connection()

    async def _connection(self) -> tuple[asyncssh.SSHClientConnection, bool]:
        """The live connection and whether it was opened just now."""
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn, False
            self._drop()
            tunnel = None
            jumps = await self._jump_hosts()
            for hop in jumps.split(",") if jumps else []:
                user, host, port = split_jump(hop.strip())
                tunnel = await self._connect(host, port, user, tunnel)
                self._jump_conns.append(tunnel)
            self._conn = await self._connect(self.host, self.port, self.username, tunnel)
            return self._conn, True

    async def _jump_hosts(self) -> str | None:
        """The jump host(s): given, or ssh_config's ProxyJump. We open those hops ourselves
        so they are checked against the same known_hosts and refused keys name the hop."""
        if self.jump is not None or self._config is None:
            return self.jump
        try:
            resolved = await asyncssh.SSHClientConnectionOptions.construct(
                host=self.host,
                port=self.port or (),
                config=() if self._config is DEFAULT else [str(self._config)],
                known_hosts=None,
            )
        except (ValueError, OSError) as exc:
            raise DestinationRefused(f"ssh_config for {self.host}: {exc}") from exc
        tunnel = resolved.tunnel
        if not isinstance(tunnel, str) or tunnel.lower() == "none":
            return None
        try:
            for hop in tunnel.split(","):
                check_destination("ProxyJump", hop.strip())
        except ValueError as exc:
            raise DestinationRefused(f"ssh_config for {self.host}: {exc}") from None
        return tunnel

    async def _connect(
        self,
        host: str,
        port: int | None,
        username: str | None,
        tunnel: asyncssh.SSHClientConnection | None,
    ) -> asyncssh.SSHClientConnection:
        options = self._options(username)
        who = f"{host}:{port}" if port else host
        try:
            return await asyncssh.connect(host, port or (), tunnel=tunnel or (), **options)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise await self._unknown_key(host, port, tunnel, options) from exc
        except asyncssh.PermissionDenied as exc:
            raise AuthenticationFailed(f"{who}: login refused: {exc.reason}") from exc
        except ValueError as exc:
            # asyncssh's word for a bad option or ssh_config entry: retrying cannot help.
            raise DestinationRefused(f"{who}: {exc}") from exc
        except (*SSH_ERRORS, asyncio.TimeoutError) as exc:
            raise TransportError(f"{who}: cannot connect: {exc or type(exc).__name__}") from exc

    async def _unknown_key(
        self,
        host: str,
        port: int | None,
        tunnel: asyncssh.SSHClientConnection | None,
        options: dict[str, Any],
    ) -> TransportError:
        try:
            real_host, real_port, key = await within(
                trust.fetch_host_key(host, port, tunnel, options.get("config", ())),
                self.connect_timeout,
            )
        except (*SSH_ERRORS, asyncio.TimeoutError) as exc:
            return TransportError(f"{host}:{port or 22}: host key refused, then {exc}")
        if key is None:
            return TransportError(f"{real_host}:{real_port}: server presented no host key")
        return HostKeyUnknown(
            real_host,
            real_port,
            trust.fingerprint(key),
            key=key,
            changed=trust.host_is_listed(self.known_hosts_path, real_host, real_port),
            known_hosts_path=self.known_hosts_path,
        )

    async def _process(self, argv: Sequence[str]) -> asyncssh.SSHClientProcess[bytes]:
        command = self.command_line(argv)
        while True:
            conn, fresh = await self._connection()
            try:
                process = await conn.create_process(command, encoding=None)
            except SSH_ERRORS as exc:
                await self._forget(conn)
                # A reused connection may have died unnoticed; nothing ran, so one retry
                # on a fresh connection is safe.
                if fresh:
                    raise TransportError(f"{self.description}: {exc}") from exc
                continue
            process.stdin.write_eof()
            return process

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        process = await self._process(argv)
        try:
            out, err = await within(process.communicate(), timeout)
        except asyncio.TimeoutError:
            raise CommandTimeout(argv, timeout) from None
        except SSH_ERRORS as exc:
            await self._forget(process.channel.get_connection())
            raise TransportError(f"{self.description}: connection lost: {exc}") from exc
        finally:
            process.close()
        rc = process.returncode
        return CommandResult(255 if rc is None else rc, out or b"", err or b"")

    @contextlib.asynccontextmanager
    async def stream(self, argv: Sequence[str]) -> AsyncIterator[LineStream]:
        process = await self._process(argv)
        conn = process.channel.get_connection()
        stderr = bytearray()
        drain = asyncio.create_task(drain_tail(process.stderr.read, stderr))

        async def read(size: int) -> bytes:
            try:
                return await process.stdout.read(size)
            except SSH_ERRORS as exc:
                await self._forget(conn)
                raise TransportError(f"{self.description}: connection lost: {exc}") from exc

        async def finish() -> StreamEnd:
            with contextlib.suppress(asyncio.TimeoutError, *SSH_ERRORS):
                await within(process.wait_closed(), STOP_GRACE_S)
                await within(drain, STOP_GRACE_S)
            return StreamEnd(process.returncode, last_bytes(stderr))

        try:
            yield LineStream(read, finish)
        finally:
            await _end_remote(process)
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, *SSH_ERRORS):
                await drain

    async def _forget(self, conn: asyncssh.SSHClientConnection) -> None:
        async with self._lock:
            if conn is self._conn:
                self._drop()

    def _drop(self) -> None:
        for conn in [self._conn, *self._jump_conns]:
            if conn is not None:
                conn.abort()
        self._conn = None
        self._jump_conns = []

    async def close(self) -> None:
        async with self._lock:
            conns = [c for c in (self._conn, *reversed(self._jump_conns)) if c is not None]
            self._conn = None
            self._jump_conns = []
        for conn in conns:
            conn.close()
            with contextlib.suppress(*SSH_ERRORS):
                await within(conn.wait_closed(), STOP_GRACE_S)


async def _end_remote(process: asyncssh.SSHClientProcess[bytes]) -> None:
    """Ask the remote command to stop and close its channel; abort the channel if the
    server does not confirm in time. Closing reaches a `tail --follow` as a broken pipe."""
    with contextlib.suppress(*SSH_ERRORS):
        process.terminate()
    process.close()
    try:
        await within(process.wait_closed(), STOP_GRACE_S)
    except (asyncio.TimeoutError, *SSH_ERRORS):
        process.channel.abort()
