"""The console side of the reliability tests: SSH transports to the loopback servers, a
Session wired to a recorder that keeps what a console would (every line, every reject,
every connection state, a RunState), and a polling wait for async tests."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_train.protocol import Rejected, StatusLine
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.known_hosts import trust_host_key
from dflash_tui.sources.session import ConnectionState, Session
from dflash_tui.sources.state import RunState
from dflash_tui.sources.transport import SshTransport
from tests.sshd import LOOPBACK, ClientKey

PCT_PREFIX = ("pct", "exec", "200", "--")
BOX_PYTHON = sys.executable
FAST_BACKOFF = Backoff(initial=0.05, cap=0.3)


async def wait_until(check: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'a condition'}")
        await asyncio.sleep(0.05)


def ssh_transport(
    port: int,
    known_hosts: Path,
    key: ClientKey | None,
    *,
    keepalive: float = 2,
) -> SshTransport:
    """A transport as the console builds it, through the pct shim. `key` None: the
    default keys and the ssh-agent named by SSH_AUTH_SOCK."""
    keys: Any = [key.private_path] if key is not None else ()
    options: dict[str, Any] = {} if key is None else {"client_keys": keys}
    return SshTransport(
        LOOPBACK,
        port=port,
        username="root",
        exec_prefix=PCT_PREFIX,
        known_hosts=known_hosts,
        config_path=None,
        keepalive_interval=keepalive,
        connect_timeout=5,
        **options,
    )


def trusted(path: Path, port: int, host_key: Any) -> Path:
    trust_host_key(LOOPBACK, port, host_key, path)
    return path


class Recorder:
    """What one console keeps of a follow."""

    def __init__(self, *, stall_after: float = 60.0) -> None:
        self.lines: list[StatusLine] = []
        self.rejected: list[Rejected] = []
        self.states: list[ConnectionState] = []
        self.state = RunState(stall_after=stall_after)
        # Run ids in the order the console met them (one entry per switch).
        self.runs: list[str] = []

    def on_line(self, line: StatusLine) -> None:
        self.lines.append(line)
        if not self.runs or self.runs[-1] != line.run:
            self.runs.append(line.run)
        self.state.apply(line)

    def on_reject(self, rejected: Rejected) -> None:
        self.rejected.append(rejected)
        self.state.count_rejected(rejected)

    def session(
        self, transport: SshTransport, run_dir: Path | str, *, read_only: bool, **kw: Any
    ) -> Session:
        return Session(
            transport,
            run_dir=str(run_dir),
            python=BOX_PYTHON,
            read_only=read_only,
            on_line=self.on_line,
            on_reject=self.on_reject,
            on_connection=self.states.append,
            backoff=FAST_BACKOFF,
            **kw,
        )

    def live_seqs(self, run: str | None = None) -> list[int]:
        """Seqs of live lines (not the decimated history summary), of one run if given."""
        return [
            ln.seq
            for ln in self.lines
            if not ln.get("history")
            and ln.get("code") != "history_end"
            and (run is None or ln.run == run)
        ]

    def count(self, status: str) -> int:
        return sum(1 for s in self.states if s.status == status)
