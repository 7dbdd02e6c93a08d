"""How the console runs `dflash-train` on the box: the `Transport` protocol, met by a local
subprocess (LocalTransport) or a command over one reused asyncssh connection
(SshTransport). Commands are argv lists quoted exactly once with shlex.join; no shell
string is ever built from user text.

A timed-out `run` gives up on the command (the local child is killed; the SSH channel is
closed) but a remote command may keep running: stopping a run always goes through
`dflash-train stop`, never through a dropped channel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dflash_tui.sources.line_stream import LineStream
from dflash_tui.sources.local_transport import LocalTransport
from dflash_tui.sources.transport_types import (
    DEFAULT,
    AuthenticationFailed,
    CommandResult,
    CommandTimeout,
    DestinationRefused,
    HostKeyUnknown,
    TransportError,
)

if TYPE_CHECKING:
    from dflash_tui.sources.ssh_transport import SshTransport

__all__ = [
    "DEFAULT",
    "AuthenticationFailed",
    "CommandResult",
    "CommandTimeout",
    "DestinationRefused",
    "HostKeyUnknown",
    "LocalTransport",
    "SshTransport",
    "Transport",
    "TransportError",
]


class Transport(Protocol):
    description: str

    async def connect(self) -> None: ...

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult: ...

    def stream(self, argv: Sequence[str]) -> contextlib.AbstractAsyncContextManager[LineStream]:
        """Complete output lines of a long-running command, without their newline. Leaving
        the context terminates the command (bounded wait)."""
        ...

    async def close(self) -> None: ...


def __getattr__(name: str) -> Any:
    """SshTransport on first use: its module imports asyncssh, which `--help`, the demo and a
    console on this machine never need (~0.2 s of the console's start)."""
    if name == "SshTransport":
        from dflash_tui.sources.ssh_transport import SshTransport

        return SshTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
