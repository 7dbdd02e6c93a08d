"""known_hosts handling without a server (the trusted line, file modes, changed keys), and
the destination names SshTransport refuses to pass on to ssh_config."""

from __future__ import annotations

import stat
from pathlib import Path

import asyncssh
import pytest

from dflash_tui.sources.destination import split_jump
from dflash_tui.sources.known_hosts import (
    host_is_listed,
    host_pattern,
    load_known_hosts,
    trust_host_key,
)
from dflash_tui.sources.transport import DestinationRefused, SshTransport


def test_trusting_appends_one_plain_line(tmp_path: Path) -> None:
    path = tmp_path / "dot-ssh" / "known_hosts"
    key = asyncssh.generate_private_key("ssh-ed25519", comment="server comment")
    trust_host_key("box", 22, key, path)
    path.write_text(path.read_text().rstrip("\n"))  # an editor left no final newline
    trust_host_key("10.0.0.5", 2222, key, path)
    lines = path.read_text().splitlines()
    public = key.export_public_key().decode().split()
    assert lines == [f"box {public[0]} {public[1]}", f"[10.0.0.5]:2222 {public[0]} {public[1]}"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert host_is_listed(path, "10.0.0.5", 2222)
    assert not host_is_listed(path, "10.0.0.5", 22)
    assert host_pattern("h", 22) == "h" and host_pattern("h", 23) == "[h]:23"


def test_a_missing_file_trusts_nothing(tmp_path: Path) -> None:
    known = load_known_hosts(tmp_path / "absent")
    assert known is not None
    assert not host_is_listed(tmp_path / "absent", "box", 22)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("host", {"host": "box;touch x"}),
        ("host", {"host": "-oProxyCommand=x"}),
        ("host", {"host": "box $(id)"}),
        ("user", {"host": "box", "username": "root`id`"}),
        ("jump", {"host": "box", "jump": "a@b|c"}),
    ],
)
def test_names_that_could_reach_a_shell_are_refused(field: str, kwargs: dict[str, str]) -> None:
    # An ssh_config ProxyCommand or `Match exec` expands %h/%r through a shell.
    with pytest.raises(ValueError, match=f"^{field}: "):
        SshTransport(**kwargs)  # type: ignore[arg-type]


def test_split_jump() -> None:
    assert split_jump("ops@bastion:2200") == ("ops", "bastion", 2200)
    assert split_jump("bastion") == (None, "bastion", None)
    assert split_jump("ops@[::1]") == ("ops", "[::1]", None)


async def test_a_proxyjump_with_shell_characters_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host box\n  HostName 127.0.0.1\n  ProxyJump evil$(id)\n")
    transport = SshTransport("box", known_hosts=tmp_path / "kh", config_path=config)
    with pytest.raises(DestinationRefused, match="ProxyJump") as info:
        await transport.connect()
    assert not info.value.retryable


async def test_a_broken_ssh_config_is_a_final_error(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host box\n  Port notanumber\n")
    transport = SshTransport("box", known_hosts=tmp_path / "kh", config_path=config)
    with pytest.raises(DestinationRefused) as info:
        await transport.connect()
    assert not info.value.retryable and "box" in str(info.value)
