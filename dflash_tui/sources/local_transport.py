"""LocalTransport: runs the trainer's commands on this machine as argv through asyncio
subprocesses (no shell), optionally behind an exec prefix such as `docker exec NAME`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Sequence

from dflash_tui.sources.deadline import within
from dflash_tui.sources.line_stream import LineStream, StreamEnd, drain_tail, last_bytes
from dflash_tui.sources.transport_types import (
    STOP_GRACE_S,
    CommandResult,
    CommandTimeout,
    TransportError,
    describe_prefix,
)


class LocalTransport:
    """Runs commands on this machine: exec_prefix + argv through asyncio subprocesses, no
    shell. Each child gets its own session so a timeout or a closed stream can signal
    its whole process group."""

    def __init__(self, exec_prefix: Sequence[str] = ()) -> None:
        self.exec_prefix = tuple(exec_prefix)
        self.description = "local" + describe_prefix(self.exec_prefix)

    async def connect(self) -> None:
        return None

    async def _spawn(self, argv: Sequence[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self.exec_prefix,
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        try:
            proc = await self._spawn(argv)
        except OSError as exc:
            return CommandResult(127, b"", f"{argv[0] if argv else ''}: {exc}".encode())
        try:
            out, err = await within(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            await _stop_local(proc)
            raise CommandTimeout(argv, timeout) from None
        except asyncio.CancelledError:
            await _stop_local(proc)
            raise
        return CommandResult(proc.returncode if proc.returncode is not None else -1, out, err)

    @contextlib.asynccontextmanager
    async def stream(self, argv: Sequence[str]) -> AsyncIterator[LineStream]:
        try:
            proc = await self._spawn(argv)
        except FileNotFoundError as exc:
            # As a shell (over SSH) answers a missing command: an empty stream, exit 127.
            yield _not_found(f"{argv[0] if argv else ''}: {exc}")
            return
        except OSError as exc:
            raise TransportError(f"{argv[0] if argv else ''}: {exc}") from exc
        assert proc.stdout is not None and proc.stderr is not None
        stderr = bytearray()
        drain = asyncio.create_task(drain_tail(proc.stderr.read, stderr))

        async def finish() -> StreamEnd:
            with contextlib.suppress(asyncio.TimeoutError):
                await within(proc.wait(), STOP_GRACE_S)
                await within(drain, STOP_GRACE_S)
            return StreamEnd(proc.returncode, last_bytes(stderr))

        try:
            yield LineStream(proc.stdout.read, finish)
        finally:
            await _stop_local(proc)
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain

    async def close(self) -> None:
        return None


def _not_found(message: str) -> LineStream:
    async def read(size: int) -> bytes:
        return b""

    async def finish() -> StreamEnd:
        return StreamEnd(127, message.encode())

    return LineStream(read, finish)


async def _stop_local(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the child's process group, SIGKILL it after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(asyncio.TimeoutError):
            await within(proc.wait(), STOP_GRACE_S)
