"""The watch-only views on real runs of the real trainer (a tiny random target on the CPU),
reached over OpenSSH on loopback through the pct shim: `dflash-tui serve` in a real
headless Chromium (Debian's, driven by Playwright) shows the live steps read-only, saves a
screenshot, and l/S/R/m pressed in the browser send nothing that changes the box; `replay`
walks a run that trained, checkpointed and finished, and sends nothing but `tail`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_train.rundir import lock_is_held
from dflash_tui.subcommands import serve_command
from tests.browser import CHROMIUM, CHROMIUM_ARGS
from tests.reliability import box
from tests.sshd import LOGIN, LOOPBACK, ClientKey, OpenSshServer, free_port
from tests.tui.conftest import server_key, trusted_known_hosts

MUTATING = ("launch", "stop", "restart", "set")
# A random tiny target (no weights to load) and small batches: several real training steps
# a second even on a loaded 2-core box (later options win over the suite's tiny ones).
TINY_TARGET = "random:tiny"
FAST_STEPS = ("--pipeline", "sync", "--tokens-per-batch", "256", "--num-anchors", "4")


@pytest.fixture
def live_tiny_run(tiny_data: Path, tmp_path: Path) -> Iterator[Path]:
    run_dir = tmp_path / "run"
    args = box.tiny_train_args(
        TINY_TARGET, tiny_data, *FAST_STEPS, "--epochs", "500", "--save-every", "0"
    )
    reply = box.launch(run_dir, args)
    assert reply.ok, reply
    try:
        yield run_dir
    finally:
        box.kill_run(run_dir)


def ssh_home(root: Path, key: ClientKey, server: OpenSshServer) -> Path:
    """A HOME whose ~/.ssh holds the test key and the server's host key: the served consoles
    use the SSH client's usual sources, as on an operator's laptop."""
    home = root / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    shutil.copy(key.private_path, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    trusted_known_hosts(ssh / "known_hosts", server.port, server_key(server))
    return home


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = asyncio.get_event_loop().time() + timeout
    while asyncio.get_event_loop().time() < deadline:
        assert proc.poll() is None, "serve exited"
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.5):
            return
        subprocess.run(["sleep", "0.1"], check=False)
    raise AssertionError(f"nothing listening on {port}")


def test_serve_command_quotes_once_and_watches() -> None:
    command = serve_command(["root@box", "--run-dir", "/runs/a b; rm -rf /"])
    assert command.endswith("--run-dir '/runs/a b; rm -rf /' --watch")


async def test_serve_in_a_real_browser(
    live_tiny_run: Path,
    openssh_server: OpenSshServer,
    client_key: ClientKey,
    tmp_path: Path,
) -> None:
    from playwright.async_api import async_playwright

    run_dir = live_tiny_run
    record_before = (run_dir / "run.json").read_bytes()
    commands_before = len(openssh_server.received())
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(ssh_home(tmp_path, client_key, openssh_server)),
        "DFLASH_CONFIG": str(tmp_path / "no-config.toml"),
    }
    destination = [
        f"{LOGIN}@{LOOPBACK}:{openssh_server.port}", "--container", "200",
        "--run-dir", str(run_dir), "--python", sys.executable,
    ]  # fmt: skip
    serve = subprocess.Popen(
        [sys.executable, "-m", "dflash_tui.cli", "serve", "--port", str(port), *destination],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    received: list[bytes] = []
    screenshot = tmp_path / "serve.png"
    try:
        wait_listening(port, serve)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1500, "height": 900})

            def on_socket(ws):  # type: ignore[no-untyped-def]
                ws.on(
                    "framereceived",
                    lambda payload: received.append(
                        payload if isinstance(payload, bytes) else payload.encode()
                    ),
                )

            page.on("websocket", on_socket)

            # The page asks a font host for Roboto Mono; there is no network here to wait on.
            async def offline(route):  # type: ignore[no-untyped-def]
                await route.abort()

            await page.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), offline)
            await page.goto(f"http://{LOOPBACK}:{port}/")

            def screen_text() -> str:
                return b"".join(received).decode("utf-8", "replace")

            async def until(check, what: str, timeout: float = 180) -> None:  # type: ignore[no-untyped-def]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while not check():
                    assert loop.time() < deadline, f"{what}; serve said: {serve_stderr(serve)}"
                    await asyncio.sleep(0.2)

            def steps() -> set[int]:
                found = re.findall(r"step ([\d,]+)/", screen_text())
                return {int(s.replace(",", "")) for s in found}

            await until(lambda: len(steps()) >= 2, "two different live steps on the page")
            assert "READ-ONLY" in screen_text()
            await page.screenshot(path=str(screenshot))

            await page.click(".textual-terminal")
            for key in ("l", "S", "R", "m"):
                await page.keyboard.press(key)
                await asyncio.sleep(0.3)
            seen = max(steps())
            await until(lambda: max(steps()) > seen + 1, "steps still arriving after the keys")
            await browser.close()
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(15)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        # The consoles it started for the browser are in its session: none outlives the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve.pid, signal.SIGKILL)
    assert (
        screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
    )
    # Nothing reached the box but reading: the run is the one launched, untouched.
    commands = openssh_server.received()[commands_before:]
    assert any(" tail " in c for c in commands)
    assert not [c for c in commands if set(c.split()) & set(MUTATING)]
    assert (run_dir / "run.json").read_bytes() == record_before
    assert not (run_dir / "control.json").exists()
    assert lock_is_held(run_dir / "run.lock")
    assert json.loads(record_before)["run_id"] == box.status(run_dir).data["run_id"]


def serve_stderr(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None or proc.stderr is None:
        return "(still running)"
    return proc.stderr.read().decode(errors="replace")[-2000:]


async def test_replay_a_finished_real_run_over_openssh(
    tiny_data: Path, openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    """A real run that trained, checkpointed and finished, replayed over SSH through the
    pct shim: the whole stream arrives through `tail`, the cursor walks it both ways, and
    nothing but `tail` reaches the box."""
    from dflash_tui.app import ConsoleOptions
    from dflash_tui.replay_app import ReplayApp
    from tests.tui.conftest import PCT_PREFIX, transport_to
    from tests.tui.console_harness import wait_until

    run_dir = tmp_path / "run"
    extra = (*FAST_STEPS, "--epochs", "500", "--max-steps", "8", "--save-every", "3")
    args = box.tiny_train_args(TINY_TARGET, tiny_data, *extra)
    reply = box.launch(run_dir, args)
    assert reply.ok, reply
    try:
        box.wait_line(run_dir, lambda ln: ln.kind == "run_end", what="the run's end")
    finally:
        box.kill_run(run_dir)
    on_disk = box.lines(run_dir)
    commands_before = len(openssh_server.received())
    known = trusted_known_hosts(
        tmp_path / "known_hosts", openssh_server.port, server_key(openssh_server)
    )
    transport = transport_to(openssh_server.port, client_key, known, exec_prefix=PCT_PREFIX)
    options = ConsoleOptions(
        target_name=transport.description, run_dir=str(run_dir), python=sys.executable
    )
    app = ReplayApp(transport, options)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: app.timeline is not None, timeout=60)
        timeline = app.timeline
        assert timeline is not None and len(timeline) == len(on_disk)
        assert app.state.end is not None and app.state.end["reason"] == "completed"
        assert app.badge() == "finished" and app.state.step == 8
        await pilot.press("[")  # back from the end: the last checkpoint (before run_end)
        assert timeline.kind(timeline.position) in ("checkpoint", "event")
        assert app.state.end is None and app.badge() == "running"
        await pilot.press("home", "right", "right")
        assert app.state.step == 2 and app.state.checkpoint is None
        for _ in range(20):  # over epoch ends to the first checkpoint
            await pilot.press("]")
            if timeline.kind(timeline.position) == "checkpoint":
                break
        assert timeline.kind(timeline.position) == "checkpoint"
        assert app.state.checkpoint is not None
        assert app.state.checkpoint.seq == timeline.seq(timeline.position)
        for key in ("l", "S", "R", "m"):
            await pilot.press(key)
            assert app.screen is app.main_screen(), key
        await pilot.press("end")
        assert app.state.run_state == "finished"
    commands = openssh_server.received()[commands_before:]
    assert commands and all(" tail " in c and "--follow" not in c for c in commands), commands
