"""Host-key trust for the SSH transport: load known_hosts, tell an unknown key from a
changed one, fetch a server's key to show its fingerprint, and append it only when the
operator explicitly says yes (there is no trust-on-first-use)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # asyncssh is imported where an SSH connection needs it (~0.2 s at start)
    import asyncssh

DEFAULT_KNOWN_HOSTS = Path("~", ".ssh", "known_hosts")
SSH_DEFAULT_PORT = 22


def resolve_path(path: str | os.PathLike[str] | None) -> Path:
    return Path(path if path is not None else DEFAULT_KNOWN_HOSTS).expanduser()


def load_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    """The trusted keys in `path`; a missing file trusts nothing. Always an object, never
    None: passing None to asyncssh would switch host-key checking off."""
    import asyncssh

    if path.is_file():
        return asyncssh.read_known_hosts(str(path))
    return asyncssh.import_known_hosts("")


def host_pattern(host: str, port: int) -> str:
    # OpenSSH's known_hosts spelling: a bare name on port 22, "[name]:port" elsewhere.
    return host if port == SSH_DEFAULT_PORT else f"[{host}]:{port}"


def host_is_listed(path: Path, host: str, port: int) -> bool:
    """True when known_hosts already holds some key for host:port, i.e. a refused key is a
    *changed* key rather than an unknown one."""
    import asyncssh

    trusted = asyncssh.match_known_hosts(load_known_hosts(path), host, "", port)
    return bool(trusted[0])


async def fetch_host_key(
    host: str,
    port: int | None,
    tunnel: asyncssh.SSHClientConnection | None,
    config: Any,
) -> tuple[str, int, asyncssh.SSHKey | None]:
    """The key a server presents, with the real host and port behind an ssh_config alias
    (resolved the way connect() does), which is what a trusted line must name."""
    import asyncssh

    resolved = await asyncssh.SSHClientConnectionOptions.construct(
        host=host, port=port or (), config=config, known_hosts=None
    )
    key = await asyncssh.get_server_host_key(host, port or (), tunnel=tunnel or (), config=config)
    return resolved.host, resolved.port, key


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


def trust_host_key(host: str, port: int, key: asyncssh.SSHKey, known_hosts_path: Path) -> None:
    """Append host:port's key to known_hosts. Call only on the operator's explicit yes."""
    path = resolve_path(known_hosts_path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    public = key.export_public_key("openssh").decode("ascii").split()
    # Keep only "type base64"; a comment from the server has no place in our file.
    line = f"{host_pattern(host, port)} {public[0]} {public[1]}\n"
    existing = path.read_bytes() if path.exists() else b""
    prefix = "" if not existing or existing.endswith(b"\n") else "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as fh:
        fh.write(prefix + line)
