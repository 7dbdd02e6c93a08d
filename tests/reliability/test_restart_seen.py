"""A restart seen by a console that did not ask for it: a watching console follows a real
trainer over OpenSSH while the box's CLI (another operator, or a script) restarts the run.
Between the two trainers the watcher reads RESTARTING, never STOPPED or FINISHED, and then
RUNNING again; `status` answers restarting while a restart holds the run dir. A restart
whose new trainer dies at startup leaves every console with that trainer's crash and a
restart_failed alert, not RESTARTING for ever."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from dflash_train import protocol
from dflash_train.rundir import RunDir, RunLock
from dflash_tui.sources.alerts import AlertTracker
from tests.reliability import box
from tests.reliability.console_side import Recorder, ssh_transport, trusted, wait_until
from tests.sshd import ClientKey, OpenSshServer


class StateRecorder(Recorder):
    """Also the run state the console read right after each line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []
        self.alerts = AlertTracker()

    def on_line(self, line: protocol.StatusLine) -> None:
        super().on_line(line)
        self.alerts.on_line(line)
        self.seen.append((line.kind, self.state.run_state))

    def after(self, kind: str, nth: int) -> list[str]:
        """The states read from the `nth` line of `kind` on (1-based), in order."""
        found = [i for i, (k, _) in enumerate(self.seen) if k == kind]
        return [state for _, state in self.seen[found[nth - 1] :]]


def corrupt_copy(data: Path, dest: Path) -> Path:
    """Prepared data whose shards are garbage that preflight cannot tell from good ones: a
    trainer started on it exits at startup."""
    shutil.copytree(data, dest)
    for shard in sorted(dest.glob("*.arrow")):
        shard.write_bytes(b"\x00garbage" * (shard.stat().st_size // 8 + 1))
    return dest


async def test_a_restart_reads_restarting_in_a_console_that_did_not_send_it(
    openssh_server: OpenSshServer,
    client_key: ClientKey,
    tmp_path: Path,
    prepared_data_dir: Path,
    smollm2_spec: str,
) -> None:
    run_dir = tmp_path / "run"
    train = box.tiny_train_args(smollm2_spec, prepared_data_dir, "--max-steps", "100000")
    env = box.env_options(box.trainer_env())
    launched = box.control("launch", str(run_dir), "--wait", "240", *env, "--", *train)
    assert launched.ok, launched
    known = trusted(tmp_path / "known_hosts", openssh_server.port, openssh_server.host_key)
    transport = ssh_transport(openssh_server.port, known, client_key)
    watcher = StateRecorder()
    session = watcher.session(transport, run_dir, read_only=True, history_points=0)
    follow = asyncio.create_task(session.follow())
    try:
        await wait_until(lambda: watcher.state.step is not None, timeout=120, what="a step")

        # The restart comes from the box's CLI, not from this console.
        restarted = await asyncio.to_thread(box.control, "restart", str(run_dir), "--wait", "240")
        assert restarted.ok, restarted
        await wait_until(
            lambda: (
                sum(k == "run_start" for k, _ in watcher.seen) >= 2
                and watcher.state.run_state == "running"
            ),
            timeout=120,
            what="the new trainer's run_start",
        )
        end = next(ln for ln in watcher.lines if ln.kind == "run_end")
        assert end["reason"] == "signal" and end.get("restarting") is True
        between = watcher.after("run_end", 1)
        assert between[0] == "restarting", watcher.seen[-20:]
        start = between.index("running")
        assert set(between[:start]) == {"restarting"}, between  # never stopped or finished

        # While a restart holds the run dir, the box's own status says so.
        with RunLock(RunDir.at(run_dir).restart_lock):
            held = await asyncio.to_thread(box.control, "status", str(run_dir))
        assert held.ok and held.data["state"] == "restarting", held
        after = await asyncio.to_thread(box.control, "status", str(run_dir))
        assert after.data["state"] == "running", after

        # A restart whose new trainer dies at startup: its crash and an alert, everywhere.
        bad = corrupt_copy(prepared_data_dir, tmp_path / "corrupt")
        failed = await asyncio.to_thread(
            box.control, "restart", str(run_dir), "--set", f"data_dir={bad}", "--wait", "240"
        )
        assert not failed.ok and failed.error_code == "exited_at_startup", failed
        await wait_until(lambda: watcher.state.restart_failed, what="the restart_failed event")
        # The new trainer's own run_end (reason error) ends RESTARTING; the box appended
        # restart_failed after it, and the tail's watch takes that for no trainer gone.
        second = watcher.after("run_end", 2)
        assert second[0] == "restarting" and second[-1] == "crashed", second
        assert watcher.state.run_state == "crashed"
        assert {"restart_failed", "crash"} <= set(watcher.alerts.active), watcher.alerts.active
        codes = [ln.get("code") for ln in watcher.lines if ln.kind == "event"]
        assert protocol.TRAINER_GONE not in codes, codes
        gone = await asyncio.to_thread(box.control, "status", str(run_dir))
        assert (gone.data["state"], gone.data["reason"]) == ("finished", "error"), gone
    finally:
        follow.cancel()
        await transport.close()
        box.control("stop", str(run_dir))
