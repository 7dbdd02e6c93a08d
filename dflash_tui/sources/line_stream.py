"""Turns a byte source (a subprocess pipe or an SSH channel) into complete lines. A partial
line at EOF is never yielded: the writer may be mid-write, and a resume cursor must only
advance over whole lines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dflash_train import protocol

READ_CHUNK = 1 << 16
STDERR_TAIL_BYTES = 4096


@dataclass(frozen=True)
class StreamEnd:
    """How a stream ended: the command's exit code (None when it never reported one, e.g.
    the connection dropped) and the last bytes it wrote on stderr."""

    returncode: int | None
    stderr_tail: bytes


class LineStream:
    """Async iterator of lines without their trailing newline. A line longer than
    `max_line` is cut to `max_line + 1` bytes (the rest skipped) so the decoder can count
    it as too long without the reader buffering megabytes."""

    def __init__(
        self,
        read: Callable[[int], Awaitable[bytes]],
        finish: Callable[[], Awaitable[StreamEnd]] | None = None,
        *,
        max_line: int = protocol.MAX_LINE_BYTES,
    ) -> None:
        self._read = read
        self._finish = finish
        self._max_line = max_line
        self._ready: list[bytes] = []
        self._next = 0
        self._pending = b""
        self._overlong: bytes | None = None
        self._eof = False
        self.end: StreamEnd | None = None
        self.partial_at_eof = b""

    def __aiter__(self) -> LineStream:
        return self

    async def __anext__(self) -> bytes:
        while self._next >= len(self._ready):
            if self._eof:
                raise StopAsyncIteration
            chunk = await self._read(READ_CHUNK)
            if not chunk:
                self._eof = True
                self.partial_at_eof = self._pending
                self._pending = b""
                if self._finish is not None:
                    self.end = await self._finish()
                continue
            self._take(chunk)
        line = self._ready[self._next]
        self._next += 1
        return line

    def _take(self, chunk: bytes) -> None:
        parts = (self._pending + chunk).split(b"\n")
        self._pending = parts.pop()
        if self._overlong is not None and parts:
            # The first newline closes the overlong line; report its head instead.
            parts[0] = self._overlong
            self._overlong = None
        elif self._overlong is not None:
            self._pending = b""
        if len(self._pending) > self._max_line:
            self._overlong = self._pending[: self._max_line + 1]
            self._pending = b""
        self._ready = parts
        self._next = 0


def last_bytes(data: bytes | bytearray) -> bytes:
    return bytes(data[-STDERR_TAIL_BYTES:])


async def drain_tail(read: Callable[[int], Awaitable[Any]], into: bytearray) -> None:
    """Read a stream to EOF keeping only its tail in `into`: an unread stderr would stall
    the command once its pipe or channel window fills."""
    while chunk := await read(4096):
        into += chunk
        del into[:-STDERR_TAIL_BYTES]
