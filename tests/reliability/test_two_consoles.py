"""Two consoles on one live run: a watching one, started the way an operator starts it
(`dflash-tui root@host:port --watch ...`, its own known_hosts and ssh-agent, through real
OpenSSH), and a controlling one (a Session over the asyncssh server). Asserted: both see
the same stream (the same lines under the same seqs); launching a second trainer on the
run is refused by the box (twice, concurrently) and leaves the live one untouched; the
watching console cannot launch at all, by key or by call, and sends nothing mutating."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from dflash_tui import cli
from dflash_tui.sources.session import ReadOnlyError
from tests.reliability import box
from tests.reliability.conftest import LiveRun
from tests.reliability.console_side import BOX_PYTHON, Recorder, ssh_transport, trusted
from tests.sshd import ClientKey, InProcessServer

MUTATING = (" launch ", " stop ", " restart ", " set ")


def steps_after(
    points: Iterable[tuple[float, float]], first: int, last: int
) -> list[tuple[float, float]]:
    return [p for p in points if first < p[0] <= last]


async def test_watch_and_control_consoles_share_the_stream_and_refuse_a_second_launch(
    live_run: LiveRun,
    inproc_server: InProcessServer,
    client_key: ClientKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prepared_data_dir: Path,
    smollm2_spec: str,
) -> None:
    run_dir = live_run.run_dir
    # The watching console, from the command line, with the operator's own files.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    trusted(home / ".ssh" / "known_hosts", live_run.server.port, live_run.server.host_key)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DFLASH_CONFIG", str(tmp_path / "dflash.toml"))
    monkeypatch.setenv("SSH_AUTH_SOCK", live_run.agent_socket)
    argv = [
        f"root@127.0.0.1:{live_run.server.port}", "--container", "200", "--watch",
        "--run-dir", str(run_dir), "--python", BOX_PYTHON,
    ]  # fmt: skip
    args = cli.build_parser().parse_args(argv)
    watch_app = cli.build_console(args, cli.exec_prefix(args))
    assert watch_app.read_only
    before = len(live_run.server.received())

    known = trusted(tmp_path / "known_hosts", inproc_server.port, inproc_server.host_key)
    control_transport = ssh_transport(inproc_server.port, known, client_key)
    controller = Recorder()
    control = controller.session(control_transport, run_dir, read_only=False)
    follow = asyncio.create_task(control.follow())
    train_args = box.tiny_train_args(smollm2_spec, prepared_data_dir, "--epochs", "1")
    try:
        async with watch_app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 60
            while len(controller.live_seqs()) < 3 or watch_app.state.step is None:
                assert time.monotonic() < deadline, "the consoles never showed the run"
                await pilot.pause(0.1)
            common_from = max(controller.lines[-1].seq, watch_app.state.last_seq or 0)
            step_from = max(controller.state.step or 0, watch_app.state.step or 0)
            deadline = time.monotonic() + 60
            while (controller.state.step or 0) < step_from + 3 or (
                watch_app.state.step or 0
            ) < step_from + 3:
                assert time.monotonic() < deadline, "the run stopped moving"
                await pilot.pause(0.1)

            # A second launch, twice at once, from the controlling console: refused.
            replies = await asyncio.gather(
                control.launch(train_args, env=box.trainer_env()),
                control.launch(train_args, env=box.trainer_env()),
            )
            for reply in replies:
                assert not reply.ok and reply.error_code in ("already_running", "busy"), reply
            assert any(r.error_code == "already_running" for r in replies)
            assert any(r.data.get("pid") == live_run.launch_reply.data["pid"] for r in replies)

            # The watching console cannot launch, by key or by call.
            await pilot.press("l")
            await pilot.pause(0.3)
            assert type(watch_app.screen).__name__ == "MainScreen"
            with pytest.raises(ReadOnlyError):
                await watch_app.session.launch(train_args)
            last = min(controller.state.step or 0, watch_app.state.step or 0)
            watch_loss = steps_after(watch_app.state.metrics["loss"], step_from, last)
            watch_seq = watch_app.state.last_seq
    finally:
        follow.cancel()
        await control_transport.close()
    # The same stream: identical step lines where both were live, and both advanced.
    control_loss = steps_after(controller.state.metrics["loss"], step_from, last)
    assert control_loss == watch_loss and len(control_loss) >= 3
    assert watch_seq is not None and watch_seq > common_from
    # The live trainer was not disturbed.
    status = box.status(run_dir)
    assert status.data["state"] == "running"
    assert status.data["pid"] == live_run.launch_reply.data["pid"]
    watch_sent = live_run.server.received()[before:]
    assert watch_sent and not [c for c in watch_sent if any(m in c for m in MUTATING)]
    control_sent = inproc_server.received()
    assert sum(" launch " in c for c in control_sent) == 2
