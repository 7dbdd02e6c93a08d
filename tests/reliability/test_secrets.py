"""Secrets: the shared run was launched from a console over OpenSSH with WANDB_API_KEY in
its environment, the console authenticating with a passphrase-protected key held by a
real ssh-agent. Asserted: neither the W&B key nor the passphrase appears in the status
stream, train.log, run.json, any other file of the run dir, the trainer's command line,
the control replies, or an SVG screenshot of the console attached to the run (showing the
launch reply); the W&B key does reach the trainer's environment, where it is needed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.screens.reply import ReplyDialog
from tests.reliability import box
from tests.reliability.conftest import PASSPHRASE, WANDB_SECRET, LiveRun
from tests.reliability.console_side import BOX_PYTHON, ssh_transport
from tests.tui.console_harness import wait_until

SECRETS = (WANDB_SECRET.encode(), PASSPHRASE.encode())
# A leak would rarely be verbatim only: look for telling fragments too.
FRAGMENTS = (WANDB_SECRET[-24:].encode(), PASSPHRASE[:24].encode())


def leaks(data: bytes) -> list[bytes]:
    return [s for s in (*SECRETS, *FRAGMENTS) if s in data]


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


async def test_secrets_never_written_or_shown(
    live_run: LiveRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run_dir = live_run.run_dir
    box.wait_line(run_dir, lambda ln: ln.kind == "step", what="a training step")
    pid = live_run.launch_reply.data["pid"]
    # Where the key must be, it is: the trainer's own environment.
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"WANDB_API_KEY=" + SECRETS[0] in environ

    checked: dict[str, int] = {}

    def check(name: str, data: bytes) -> None:
        assert not leaks(data), f"secret found in {name}"
        checked[name] = len(data)

    check("trainer command line", Path(f"/proc/{pid}/cmdline").read_bytes())
    check("launch reply", live_run.launch_reply.to_json().encode())
    check("status reply", box.status(run_dir).to_json().encode())
    tail = subprocess.run(
        [*box.TRAINER, "tail", str(run_dir), "--history", "50"], capture_output=True, timeout=60
    )
    check("tail output", tail.stdout + tail.stderr)
    record = box.run_record(run_dir)
    assert record["env"]["WANDB_API_KEY"] == "<redacted>"
    for path in files_under(run_dir):
        check(str(path.relative_to(run_dir)), path.read_bytes())
    for name in ("status.jsonl", "train.log", "run.json"):
        assert checked.get(name, 0) > 0, f"{name} was not checked"

    # The console, attached through the agent-held key, showing the run and the launch reply.
    monkeypatch.setenv("SSH_AUTH_SOCK", live_run.agent_socket)
    transport = ssh_transport(live_run.server.port, live_run.known_hosts, None)
    options = ConsoleOptions(
        target_name=transport.description,
        run_dir=str(run_dir),
        python=BOX_PYTHON,
        follow_gpus=False,
    )
    app = DflashApp(transport, options)
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 60
        while app.state.step is None or app.connection != "connected":
            assert time.monotonic() < deadline, "the console never showed the run"
            await pilot.pause(0.1)
        app.push_screen(ReplyDialog(live_run.launch_reply))
        run_id = live_run.launch_reply.data["run_id"]
        await wait_until(pilot, lambda: run_id in app.export_screenshot())
        svg = app.export_screenshot()
    (tmp_path / "console.svg").write_text(svg)
    assert live_run.launch_reply.data["run_id"] in svg  # the run and the reply were drawn
    check("console screenshot (SVG)", svg.encode())
    assert len(checked) >= 8, checked
