"""A loopback TCP proxy the tests control, for network-level faults between the console and
the SSH server: `reset_all()` cuts every connection with a TCP RST (both sides), and
`blackhole_all()` stops forwarding while keeping the sockets open, as a dead link does, so
only the client's keepalive can notice."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
_CHUNK = 1 << 16


@dataclass
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    blackholed: bool = False


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer gets a RST instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class DropProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self.resets = 0
        self.blackholes = 0
        self._links: list[_Link] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        link.pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer, link)),
            asyncio.ensure_future(self._pump(up_reader, writer, link)),
        ]
        self._links.append(link)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link
    ) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while chunk := await source.read(_CHUNK):
                if link.blackholed:
                    continue  # swallowed, as by a dead route
                sink.write(chunk)
                await sink.drain()
            if not link.blackholed:
                sink.close()

    def live(self) -> int:
        return sum(1 for link in self._links if not link.blackholed)

    def reset_all(self) -> int:
        """RST every live connection on both sides; returns how many were cut."""
        cut = 0
        for link in self._links:
            if link.blackholed:
                continue
            for pump in link.pumps:
                pump.cancel()
            _reset(link.client)
            _reset(link.server)
            cut += 1
        self._links = [link for link in self._links if link.blackholed]
        self.resets += cut
        return cut

    def blackhole_all(self) -> int:
        """Stop forwarding on every live connection without closing anything."""
        live = [link for link in self._links if not link.blackholed]
        for link in live:
            link.blackholed = True
        self.blackholes += len(live)
        return len(live)

    async def close(self) -> None:
        for link in self._links:
            for pump in link.pumps:
                pump.cancel()
            _reset(link.client)
            _reset(link.server)
        self._links.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
