"""An unknown host key: the console shows its fingerprint and connects only after an
explicit yes, which appends the key to known_hosts; a no writes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from textual.widgets import Static

from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.screens.host_key_prompt import HostKeyPrompt
from dflash_tui.sources.known_hosts import fingerprint, host_is_listed
from dflash_tui.widgets.header import RunHeader
from tests.sshd import LOOPBACK, ClientKey, InProcessServer
from tests.tui.conftest import transport_to
from tests.tui.console_harness import make_run_dir, wait_until


def header_text(app: DflashApp) -> str:
    main = app.main_screen()  # under the prompt
    return "" if main is None else str(main.query_one(RunHeader).render())


def ssh_console(
    server: InProcessServer, key: ClientKey, known: Path, run_dir: Path, gpus: bool = False
) -> DflashApp:
    transport = transport_to(server.port, key, known)
    options = ConsoleOptions(
        target_name=transport.description,
        run_dir=str(run_dir),
        python=sys.executable,
        follow_gpus=gpus,
    )
    return DflashApp(transport, options)


async def test_trust_on_explicit_yes_then_follow(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    run_dir = make_run_dir(tmp_path)
    app = ssh_console(inproc_server, client_key, known, run_dir)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: bool(app.screen.query("#trust")))
        # the prompt focuses "refuse" once mounted; focusing "trust" before that loses
        await wait_until(pilot, lambda: getattr(app.focused, "id", None) == "refuse")
        prompt = app.screen
        assert isinstance(prompt, HostKeyPrompt)
        assert prompt.fingerprint == fingerprint(inproc_server.host_key)
        assert not known.exists()  # nothing written before the answer
        # Asking is not failing: the header waits on the answer, and so do the notes.
        assert app.badge() == "unknown_host_key"
        await wait_until(pilot, lambda: "UNKNOWN HOST KEY" in header_text(app))
        assert [n.text for n in app.notes if "connection failed" in n.text] == []
        assert any(prompt.fingerprint in n.text for n in app.notes)
        prompt.query_one("#trust").focus()  # the prompt focuses "refuse" first
        await pilot.press("enter")
        try:
            await wait_until(pilot, lambda: app.state.step == 299)
        except AssertionError:
            notes = [n.text for n in app.notes]
            seen = (notes, app.connection, app.screen_stack, inproc_server.commands)
            raise AssertionError(f"no stream after trusting: {seen}") from None
        assert host_is_listed(known, LOOPBACK, inproc_server.port)
        assert app.connection == "connected"


async def test_refusing_writes_nothing(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    app = ssh_console(inproc_server, client_key, known, make_run_dir(tmp_path))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: bool(app.screen.query("#refuse")))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HostKeyPrompt)
        assert any("refused" in n.text for n in app.notes)
        assert app.state.step is None
        assert app.badge() == "failed"  # refused: not connecting, and the header says so
    assert not known.exists()
    assert inproc_server.commands == []  # the host was never trusted, so nothing ran


async def test_one_prompt_when_stream_and_gpu_follow_both_meet_the_unknown_key(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    """Seen in tmux: the GPU follow raised its own HostKeyUnknown, so a second prompt came
    up after the first was answered and the key was appended twice."""
    known = tmp_path / "known_hosts"
    run_dir = make_run_dir(tmp_path)
    app = ssh_console(inproc_server, client_key, known, run_dir, gpus=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: bool(app.screen.query("#trust")))
        # the prompt focuses "refuse" once mounted; focusing "trust" before that loses
        await wait_until(pilot, lambda: getattr(app.focused, "id", None) == "refuse")
        app.screen.query_one("#trust").focus()
        await pilot.press("enter")
        try:
            await wait_until(pilot, lambda: app.state.step == 299)
        except AssertionError:
            notes = [n.text for n in app.notes]
            workers = [(w.name, w.state) for w in app.workers]
            raise AssertionError(f"no stream after trusting: {notes} {workers}") from None
        await pilot.pause(0.5)
        prompts = [s for s in app.screen_stack if isinstance(s, HostKeyPrompt)]
        assert prompts == []
    lines = [ln for ln in known.read_text().splitlines() if ln.strip()]
    assert len(lines) == 1, lines


async def test_r_after_refusing_asks_again_and_trust_then_follows(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    """A key refused by mistake: `r` offers the prompt again, without quitting."""
    known = tmp_path / "known_hosts"
    app = ssh_console(inproc_server, client_key, known, make_run_dir(tmp_path))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: getattr(app.focused, "id", None) == "refuse")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HostKeyPrompt))
        assert not known.exists()
        await pilot.press("r")
        await wait_until(pilot, lambda: getattr(app.focused, "id", None) == "refuse")
        assert isinstance(app.screen, HostKeyPrompt)
        assert app.screen.fingerprint == fingerprint(inproc_server.host_key)
        app.screen.query_one("#trust").focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.state.step == 299)
    assert host_is_listed(known, LOOPBACK, inproc_server.port)


async def test_y_trusts_and_n_refuses_as_the_hint_says(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    """Seen in tmux: `y` (the yes of every other dialog) did nothing on this prompt, and
    nothing said which button Enter would press. The hint names the keys and they work."""
    known = tmp_path / "known_hosts"
    app = ssh_console(inproc_server, client_key, known, make_run_dir(tmp_path))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: getattr(app.focused, "id", None) == "refuse")
        hint = str(app.screen.query_one(".dialog-hint", Static).render())
        assert "y: Trust and connect" in hint and "n, Esc or Enter: Refuse" in hint
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(app.screen, HostKeyPrompt))
        assert app.badge() == "failed" and not known.exists()
        await pilot.press("r")
        await wait_until(pilot, lambda: getattr(app.focused, "id", None) == "refuse")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.state.step == 299)
    assert host_is_listed(known, LOOPBACK, inproc_server.port)
