"""The records and errors every transport shares: a command's result, why the box could not
be reached, and the sentinel for "use the SSH client's usual source"."""

from __future__ import annotations

import enum
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only a type here; the SSH transport imports asyncssh itself
    import asyncssh

# How long a stream's command gets to exit after we close its input/channel.
STOP_GRACE_S = 2.0


class UseDefault(enum.Enum):
    DEFAULT = "DEFAULT"


DEFAULT = UseDefault.DEFAULT
"""Use the SSH client's usual source (~/.ssh/config, ~/.ssh/known_hosts, default keys)."""


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: bytes
    stderr: bytes


class TransportError(Exception):
    """The box could not be reached or the connection dropped. `retryable` says whether
    trying again later can help (a refused host key or login cannot)."""

    retryable = True


class HostKeyUnknown(TransportError):
    """The server's host key is not in known_hosts (or differs from the one there).
    Raised before anything is sent. `key` and `known_hosts_path` let the UI offer an
    explicit trust_host_key(); `changed` means known_hosts holds a different key."""

    retryable = False

    def __init__(
        self,
        host: str,
        port: int,
        fingerprint: str,
        *,
        key: asyncssh.SSHKey | None = None,
        changed: bool = False,
        known_hosts_path: Path | None = None,
    ) -> None:
        what = "CHANGED" if changed else "unknown"
        super().__init__(f"{host}:{port}: {what} host key {fingerprint}; not connecting")
        self.host = host
        self.port = port
        self.fingerprint = fingerprint
        self.key = key
        self.changed = changed
        self.known_hosts_path = known_hosts_path

    @property
    def can_be_trusted(self) -> bool:
        """An unknown key the UI may offer for trust; a changed one never is."""
        return not self.changed and self.key is not None and self.known_hosts_path is not None


class AuthenticationFailed(TransportError):
    retryable = False


class DestinationRefused(TransportError):
    """The destination or its ssh_config entry cannot be used (a bad option, or a name
    we will not pass on: see destination.py). Final: retrying cannot help."""

    retryable = False


class CommandTimeout(TimeoutError):
    def __init__(self, argv: Sequence[str], timeout: float) -> None:
        super().__init__(f"{shlex.join(argv)}: no answer within {timeout:g} s")
        self.argv = tuple(argv)
        self.timeout = timeout


def describe_prefix(exec_prefix: Sequence[str]) -> str:
    # "pct exec 200 --" reads better without its trailing separator.
    words = [w for w in exec_prefix if w != "--"]
    return f" ({shlex.join(words)})" if words else ""
