"""Fault: the box's SSH host key is unknown, or has changed (an impostor answers at an address
whose key the console trusts: a loopback proxy forwards it to a different real sshd).
Asserted, with the real console app: the connection is refused, the fingerprint of the
key actually offered is shown to the operator, an unknown key is only trusted on an
explicit yes (refusing writes nothing), a changed key is never offered for trust, control
calls are refused too, and no command reaches any server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.screens.host_key_prompt import HostKeyPrompt
from tests.reliability.console_side import BOX_PYTHON, ssh_transport, trusted
from tests.reliability.drop_proxy import DropProxy
from tests.sshd import ClientKey, InProcessServer, OpenSshServer


def console(port: int, known: Path, key: ClientKey, run_dir: Path) -> DflashApp:
    transport = ssh_transport(port, known, key)
    options = ConsoleOptions(
        target_name="box", run_dir=str(run_dir), python=BOX_PYTHON, follow_gpus=False
    )
    return DflashApp(transport, options)


async def until(
    pilot: Pilot[None], check: Callable[[], bool], what: str, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def prompting(app: DflashApp) -> bool:
    """The trust prompt is up and drawn (its buttons exist)."""
    return isinstance(app.screen, HostKeyPrompt) and bool(app.screen.query("#trust"))


def notes(app: DflashApp) -> str:
    return "\n".join(entry.text for entry in app.notes)


@pytest.fixture
async def impostor(openssh_server: OpenSshServer) -> AsyncIterator[DropProxy]:
    proxy = DropProxy(openssh_server.port)
    await proxy.start()
    yield proxy
    await proxy.close()


async def test_unknown_key_shows_fingerprint_and_refusal_sends_nothing(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    fingerprint = inproc_server.host_key.get_fingerprint("sha256")
    app = console(inproc_server.port, known, client_key, tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await until(pilot, lambda: prompting(app), "the trust prompt")
        prompt = app.screen
        assert isinstance(prompt, HostKeyPrompt) and prompt.fingerprint == fingerprint
        await until(pilot, lambda: fingerprint in app.export_screenshot(), "it on screen")
        # The control path is refused as well, before anything is sent.
        reply = await app.session.status()
        assert not reply.ok and reply.error_code == "host_key_unknown"
        assert fingerprint in (reply.error or "")
        await pilot.press("escape")  # refuse
        await until(pilot, lambda: "host key refused" in notes(app), "the refusal note")
        assert app.connection == "failed"
    assert inproc_server.received() == []
    assert not known.exists() or known.read_text() == ""


async def test_unknown_key_is_trusted_only_on_explicit_yes(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    app = console(inproc_server.port, known, client_key, tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await until(pilot, lambda: prompting(app), "the trust prompt")
        assert inproc_server.received() == []
        await pilot.press("shift+tab")  # from the focused Refuse to Trust
        await until(pilot, lambda: getattr(app.focused, "id", None) == "trust", "focus")
        await pilot.press("enter")
        await until(pilot, lambda: inproc_server.received() != [], "the first command")
    assert f"[127.0.0.1]:{inproc_server.port}" in known.read_text()
    assert all(" tail " in c or " status " in c for c in inproc_server.received())


async def test_changed_key_is_refused_with_fingerprint_and_never_offered(
    inproc_server: InProcessServer,
    openssh_server: OpenSshServer,
    impostor: DropProxy,
    client_key: ClientKey,
    tmp_path: Path,
) -> None:
    # The console trusts the asyncssh server's key for the proxy's address; the proxy
    # leads to OpenSSH, whose key differs.
    known = trusted(tmp_path / "known_hosts", impostor.port, inproc_server.host_key)
    trusted_bytes = known.read_bytes()
    assert openssh_server.host_key is not None
    offered = openssh_server.host_key.get_fingerprint("sha256")
    before = len(openssh_server.received())
    app = console(impostor.port, known, client_key, tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await until(pilot, lambda: app.connection == "failed", "the refusal")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, HostKeyPrompt)  # never offered for trust
        assert "CHANGED host key" in notes(app) and offered in notes(app)
        await until(pilot, lambda: offered in app.export_screenshot(), "it on screen")
        for call in (app.session.status(), app.session.stop(timeout=5)):
            reply = await call
            assert not reply.ok and reply.error_code == "host_key_unknown"
            assert "CHANGED" in (reply.error or "")
    assert openssh_server.received()[before:] == [] and inproc_server.received() == []
    assert known.read_bytes() == trusted_bytes
    assert impostor.accepted >= 1  # the refusal happened on a real connection to the impostor
