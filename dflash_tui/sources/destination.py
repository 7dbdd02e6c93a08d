"""What an SSH destination (host, user, jump host) may look like before it reaches
asyncssh and ~/.ssh/config, and how a `user@host:port` jump string splits."""

from __future__ import annotations


def split_jump(jump: str) -> tuple[str | None, str, int | None]:
    """ "user@host:port" -> (user, host, port); user and port optional."""
    user, _, hostport = jump.rpartition("@")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        host, port = hostport, ""
    return (user or None, host, int(port) if port else None)


# What OpenSSH (9.6+, CVE-2023-51385) refuses in a host or user name: a ProxyCommand or
# `Match exec` in ~/.ssh/config that expands %h or %r runs it through a shell.
_SHELL_METACHARACTERS = frozenset("'`\"$\\;&<>|(){}")


def check_destination(field: str, value: str) -> None:
    """Raise ValueError naming `field` when `value` could inject into an ssh_config shell
    expansion or be read as an option."""
    if not value:
        raise ValueError(f"{field}: empty")
    if value.startswith("-"):
        raise ValueError(f"{field}: {value!r} starts with '-'")
    for char in value:
        if char in _SHELL_METACHARACTERS or char.isspace() or not char.isprintable():
            raise ValueError(f"{field}: {value!r} contains {char!r}")
