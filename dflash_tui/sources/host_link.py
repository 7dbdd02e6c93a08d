"""One connection per host, shared by every profile on it: a HostLink owns the host's
transport (opened without any exec prefix), and each profile talks through a view that puts
its own prefix (`pct exec 200 --`, `docker exec ...`) in front of its commands. Closing a
view leaves the connection to the link."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from dflash_tui.sources.line_stream import LineStream
from dflash_tui.sources.profiles import Profile
from dflash_tui.sources.transport import CommandResult, Transport
from dflash_tui.sources.transport_types import describe_prefix

TransportFactory = Callable[[Profile], Transport]


@dataclass(frozen=True)
class HostKey:
    """What makes two profiles share a connection: the same login on the same host, by
    the same route."""

    host: str | None
    port: int | None
    user: str | None
    jump: str | None

    @classmethod
    def of(cls, profile: Profile) -> HostKey:
        return cls(profile.host, profile.port, profile.user, profile.jump)

    @property
    def label(self) -> str:
        if self.host is None:
            return "local"
        who = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{who}{self.host}{port}" + (f" via {self.jump}" if self.jump else "")


def default_transport(profile: Profile) -> Transport:
    return profile.transport()


class PrefixedTransport:
    """A profile's view of its host's shared transport."""

    def __init__(self, base: Transport, exec_prefix: Sequence[str], label: str) -> None:
        self.base = base
        self.exec_prefix = tuple(exec_prefix)
        self.description = label + describe_prefix(self.exec_prefix)

    async def connect(self) -> None:
        await self.base.connect()

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        return await self.base.run([*self.exec_prefix, *argv], timeout=timeout)

    def stream(self, argv: Sequence[str]) -> contextlib.AbstractAsyncContextManager[LineStream]:
        return self.base.stream([*self.exec_prefix, *argv])

    async def close(self) -> None:
        return None  # the connection belongs to the host link


class HostLink:
    def __init__(self, key: HostKey, make_transport: TransportFactory = default_transport):
        self.key = key
        # The host's own transport: the profile's destination with no prefix of its own.
        template = Profile(
            f"host:{key.label}", host=key.host, port=key.port, user=key.user, jump=key.jump
        )
        self.transport = make_transport(replace(template, container=None, exec_prefix=()))

    def view(self, profile: Profile) -> PrefixedTransport:
        return PrefixedTransport(self.transport, profile.command_prefix(), self.key.label)

    async def close(self) -> None:
        await self.transport.close()
