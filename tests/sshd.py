"""Real SSH servers on loopback for the console's tests: an in-process asyncssh server that
logs every command it receives, and OpenSSH's sshd. Both run the command string through
/bin/sh once (as a login shell would) with a `pct` shim first on PATH, and both tag their
commands' environment so teardown can find and end whatever a dropped session left."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

LOOPBACK = "127.0.0.1"
# Both servers log in whoever runs the tests (root in CI, per SSH.md).
LOGIN = getpass.getuser()
SSHD = "/usr/sbin/sshd"
TAG_VAR = "DFLASH_TEST_SSH_TAG"

PCT_SHIM = """#!/bin/sh
# Stand-in for Proxmox's `pct exec ID [opts] -- CMD...`: runs CMD... as argv, no shell.
if [ "$1" != exec ] || [ $# -lt 2 ]; then
    echo "pct shim: usage: pct exec ID [opts] -- CMD..." >&2
    exit 2
fi
shift 2
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
if [ $# -eq 0 ]; then echo "pct shim: missing --" >&2; exit 2; fi
shift
exec "$@"
"""


@dataclass(frozen=True)
class ClientKey:
    private_path: Path
    public_line: str


def make_client_key(directory: Path) -> ClientKey:
    key = asyncssh.generate_private_key("ssh-ed25519")
    path = directory / "id_ed25519"
    key.write_private_key(str(path))
    path.chmod(0o600)
    return ClientKey(path, key.export_public_key().decode().strip())


def make_shim_dir(directory: Path) -> Path:
    shim_dir = directory / "shim-bin"
    shim_dir.mkdir(exist_ok=True)
    pct = shim_dir / "pct"
    pct.write_text(PCT_SHIM)
    pct.chmod(0o755)
    return shim_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries our tag: commands a server started for us."""
    needle = f"{TAG_VAR}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def end_tagged(tag: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = tagged_pids(tag)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while tagged_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.05)


def _command_env(shim_dir: Path, tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{shim_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    env[TAG_VAR] = tag
    return env


@dataclass
class InProcessServer:
    """asyncssh server in the test's event loop. `commands` holds every command string
    received, in order, so tests can assert on exactly what reached the box."""

    host_key: asyncssh.SSHKey
    shim_dir: Path
    workdir: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    commands: list[str] = field(default_factory=list)
    port: int = 0
    connections_accepted: int = 0
    _acceptor: asyncssh.SSHAcceptor | None = None
    _conns: list[asyncssh.SSHServerConnection] = field(default_factory=list)

    async def start(self, authorized: ClientKey) -> None:
        server = self

        class Tracker(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                server.connections_accepted += 1
                server._conns.append(conn)

        self._acceptor = await asyncssh.listen(
            LOOPBACK,
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(authorized.public_line),
            process_factory=self._handle,
            server_factory=Tracker,
            encoding=None,
            allow_scp=False,
        )
        self.port = self._acceptor.get_port()

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command or ""
        self.commands.append(command)
        child = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.workdir,
            env=_command_env(self.shim_dir, self.tag),
            start_new_session=True,
        )

        async def copy(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()

        assert child.stdout is not None and child.stderr is not None
        work = asyncio.gather(
            copy(child.stdout, process.stdout), copy(child.stderr, process.stderr), child.wait()
        )
        closed = asyncio.ensure_future(process.channel.wait_closed())
        try:
            await asyncio.wait({work, closed}, return_when=asyncio.FIRST_COMPLETED)
            if work.done() and not work.cancelled() and work.exception() is None:
                process.exit(child.returncode if child.returncode is not None else 255)
        except (asyncssh.Error, OSError):
            pass
        finally:
            closed.cancel()
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                await child.wait()
            process.close()

    def received(self) -> list[str]:
        return list(self.commands)

    def drop_connections(self) -> int:
        """Cut every client connection from the server side, as a network failure would."""
        live = [c for c in self._conns if not c.is_closed()]
        for conn in live:
            conn.abort()
        self._conns.clear()
        return len(live)

    async def close(self) -> None:
        self.drop_connections()
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
        end_tagged(self.tag)


WRAPPER = """#!/bin/sh
# Forced command: log what the client asked for, then run it through sh once, exactly as a
# login shell would, with the pct shim first on PATH.
printf '%s\\0' "$SSH_ORIGINAL_COMMAND" >> {log}
PATH={shim}:$PATH
{tag_var}={tag}
export PATH {tag_var}
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""

SSHD_CONFIG = """ListenAddress {host}
Port {port}
HostKey {host_key}
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
MaxStartups 200
MaxSessions 50
LogLevel VERBOSE
"""


@dataclass
class OpenSshServer:
    """OpenSSH's sshd in the foreground (-D) on a free loopback port."""

    directory: Path
    shim_dir: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    port: int = 0
    host_key: asyncssh.SSHKey | None = None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def command_log(self) -> Path:
        return self.directory / "commands.log"

    @property
    def log(self) -> Path:
        return self.directory / "sshd.log"

    def start(self, authorized: ClientKey) -> None:
        # sshd's privilege-separation directory; only root needs (and may create) it.
        with contextlib.suppress(PermissionError):
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        host_key_path = self.directory / "ssh_host_ed25519_key"
        self.host_key.write_private_key(str(host_key_path))
        host_key_path.chmod(0o600)
        wrapper = self.directory / "forced-command"
        wrapper.write_text(
            WRAPPER.format(log=self.command_log, shim=self.shim_dir, tag_var=TAG_VAR, tag=self.tag)
        )
        wrapper.chmod(0o755)
        (self.directory / "authorized_keys").write_text(
            f'command="{wrapper}" {authorized.public_line}\n'
        )
        self.port = free_port()
        config = self.directory / "sshd_config"
        config.write_text(
            SSHD_CONFIG.format(
                host=LOOPBACK, port=self.port, host_key=host_key_path, dir=self.directory
            )
        )
        self._proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(self.log)])
        self._wait_ready()

    def _wait_ready(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text(errors='replace')}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((LOOPBACK, self.port), 1) as s,
            ):
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-2.0-"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sshd not answering on port {self.port}")

    def received(self) -> list[str]:
        """Every command string clients asked for, in order (logged by the forced command)."""
        if not self.command_log.exists():
            return []
        raw = self.command_log.read_bytes().split(b"\0")
        return [c.decode() for c in raw[:-1]]

    def _session_pids(self) -> list[int]:
        """sshd processes serving connections: every sshd descendant of our listener."""
        assert self._proc is not None
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self._proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{child}/exe") == SSHD:
                        found.append(child)
                        todo.append(child)
        return found

    def freeze_connections(self) -> list[int]:
        """Stop (SIGSTOP) the per-connection sshd processes: the TCP connection stays up
        but nothing answers, as on a dead network. Returns the pids for thaw()."""
        pids = self._session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def freeze_host(self) -> list[int]:
        """freeze_connections, and the listener too: a new connection is then accepted by
        the kernel but never answered, as by a host that went dark (with only the connections
        frozen, a client's reconnect is served at once). thaw_and_kill() wakes it."""
        assert self._proc is not None
        pids = self.freeze_connections()
        os.kill(self._proc.pid, signal.SIGSTOP)
        return pids

    def thaw_and_kill(self, pids: list[int]) -> None:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)  # a frozen listener (freeze_host)

    def drop_connections(self) -> int:
        """Kill the per-connection sshd processes: clients see the TCP connection die."""
        pids = self._session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def stop(self) -> None:
        if self._proc is not None:
            self.drop_connections()
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        end_tagged(self.tag)
