"""Fault: the disk fills up while the trainer writes a checkpoint. The run directory lives on
a real 70 MiB tmpfs: the first checkpoint (~45 MiB) fits, the second cannot. Asserted: a
clear error reaches the stream (an `event` and the run_end naming the full disk and the
checkpoint kept), the half-written checkpoint is removed (it would keep the disk full),
the previous checkpoint stays complete and loadable, the stream is intact, and once space
is freed `restart` resumes from that checkpoint and saves again."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_train.checkpoint.store import is_complete, list_checkpoints, load_checkpoint
from dflash_tui.sources.state import RunState
from tests.reliability import box

DISK_MIB = 70


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        box.kill_run(mount / "run")
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_while_checkpointing(
    small_disk: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    run_dir = small_disk / "run"
    args = box.tiny_train_args(
        smollm2_spec,
        prepared_data_dir,
        "--pipeline", "sync",
        "--max-steps", "6",
        "--save-every", "2",
        "--keep-checkpoints", "1",
    )  # fmt: skip
    # Preflight would refuse a disk this small; the operator insists (--min-free-mb 0).
    reply = box.control(
        "launch", str(run_dir), "--wait", "200", "--min-free-mb", "0",
        *box.env_options(box.trainer_env()), "--", *args, timeout=300,
    )  # fmt: skip
    assert reply.ok, reply
    ckpts = run_dir / "checkpoints" / reply.data["run_id"]  # the run's own folder
    end = box.wait_line(run_dir, lambda ln: ln.kind == "run_end", timeout=180, what="run_end")
    box.wait_unlocked(run_dir)

    # The operator is told, in words: the disk is full, and which checkpoint is kept.
    assert end["reason"] == "error" and end["exit_code"] == 1
    assert "no space left" in end["error"] and "step_0000002" in end["error"], end["error"]
    lines = box.lines(run_dir)  # every line decodes: nothing torn by the full disk
    assert [ln.seq for ln in lines] == list(range(len(lines)))
    failed = [ln for ln in lines if ln.kind == "event" and ln["code"] == "checkpoint_failed"]
    assert len(failed) == 1 and failed[0]["level"] == "error"
    assert "no space left" in failed[0]["message"] and "step_0000002" in failed[0]["message"]
    status = box.status(run_dir)
    assert status.data["state"] == "finished" and status.data["reason"] == "error"
    console = RunState()
    for line in lines:
        console.apply(line)
    assert console.run_state == "crashed"
    assert any(e.code == "checkpoint_failed" and e.level == "error" for e in console.events)

    # Nothing half-written is left, and the previous checkpoint is whole and loads.
    assert [p.name for p in ckpts.iterdir()] == ["step_0000002"]
    assert [step for step, _ in list_checkpoints(ckpts)] == [2]
    loaded = load_checkpoint(ckpts / "step_0000002")
    assert loaded.state.step == 2 and loaded.optimizer["state"]

    # Space freed: restart resumes from it and checkpoints again.
    subprocess.run(["mount", "-o", "remount,size=200m", "tmpfs", str(small_disk)], check=True)
    back = box.control(
        "restart", str(run_dir), "--wait", "200", "--min-free-mb", "0",
        *box.env_options(box.trainer_env()), timeout=300,
    )  # fmt: skip
    assert back.ok and back.data["resumed_from"] == str(ckpts / "step_0000002"), back
    box.wait_line(
        run_dir,
        lambda ln: ln.kind == "run_end" and ln.seq > end.seq,
        timeout=180,
        what="the resumed run's end",
    )
    final = box.lines(run_dir)
    resumed = [ln for ln in final if ln.kind == "run_start"][-1]
    assert resumed["start_step"] == 2 and resumed["resumed_from"] == str(ckpts / "step_0000002")
    assert final[-1]["reason"] == "completed"
    assert [ln["step"] for ln in final[len(lines) :] if ln.kind == "checkpoint"] == [4, 6]
    assert is_complete(ckpts / "step_0000006")
