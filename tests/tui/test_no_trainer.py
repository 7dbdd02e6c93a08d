"""A box that answers but has no `dflash-train` where the console calls it (exit 127, the
shell's command not found; over OpenSSH and through the pct shim, and here): the console
says NO TRAINER (set python) and waits for the operator instead of reconnecting for ever."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.session import ConnectionState, Session
from dflash_tui.sources.transport import LocalTransport
from dflash_tui.widgets.header import RunHeader
from tests.sshd import ClientKey, OpenSshServer
from tests.tui.conftest import server_key, transport_to, trusted_known_hosts
from tests.tui.console_harness import wait_until

FAST = Backoff(initial=0.05, cap=0.2, jitter=0.0)


async def test_a_missing_trainer_ends_the_follow_with_no_trainer_over_openssh(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    known = trusted_known_hosts(
        tmp_path / "known_hosts", openssh_server.port, server_key(openssh_server)
    )
    states: list[ConnectionState] = []
    session = Session(
        transport_to(openssh_server.port, client_key, known),
        run_dir=str(tmp_path),
        python=str(tmp_path / "no-venv" / "bin" / "python"),
        read_only=True,
        on_line=lambda line: None,
        on_connection=states.append,
        backoff=FAST,
    )
    await asyncio.wait_for(session.follow(), 60)  # returns: no reconnect loop
    assert states[-1].status == "no_trainer"
    assert "set python" in (states[-1].reason or "")
    assert not any(s.status == "reconnecting" for s in states)
    reply = await session.status()
    assert reply.error_code == "no_trainer" and "set python" in (reply.error or "")
    await session.transport.close()


async def test_the_header_says_no_trainer_set_python(tmp_path: Path) -> None:
    options = ConsoleOptions(
        target_name="box",
        run_dir=str(tmp_path),
        python=str(tmp_path / "no-venv" / "bin" / "python"),
        follow_gpus=False,
    )
    app = DflashApp(LocalTransport(), options)
    async with app.run_test(size=(160, 40)) as pilot:
        header = app.screen.query_one(RunHeader)
        await wait_until(pilot, lambda: "NO TRAINER (set python)" in str(header.render()))
        assert app.connection == "no_trainer"
        assert any("set python" in n.text for n in app.notes)
