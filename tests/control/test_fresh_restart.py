"""The issue's scenario with the real control plane and real trainers: run A finishes, a
fresh restart starts run B in the same dir, then B is resumed. A's checkpoints and export
stay whole and findable, B's checkpoints survive pruning, the resume loads B's own newest
checkpoint (never A's), and an incompatible resume is refused while B keeps running."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from control_harness import cli, decode_all, trainer_env_args

from dflash_train import protocol
from dflash_train.checkpoint.store import is_complete
from dflash_train.config.recipes import CPU_TINY
from dflash_train.rundir import lock_is_held, read_json

# A randomly initialised tiny target keeps three trainer starts quick; pruning, run ids and
# resume do not depend on the weights. keep 1: the old code pruned across runs by step.
TRAIN = [
    "--target-model", "random:tiny", *CPU_TINY.argv(), "--pipeline", "sync",
    "--epochs", "50", "--max-steps", "6", "--save-every", "3", "--keep-checkpoints", "1",
]  # fmt: skip


def _stream(run_dir: Path) -> list[protocol.StatusLine]:
    return decode_all((run_dir / "status.jsonl").read_bytes())


def _wait_finished(run_dir: Path, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, reply = cli("status", str(run_dir))
        if reply.data.get("state") == "finished":
            return dict(reply.data)
        time.sleep(0.3)
    raise AssertionError(f"not finished after {timeout} s: {reply.data}")


def test_fresh_restart_keeps_the_old_run_and_resume_loads_only_its_own(
    run_dirs: Callable[[str], Path], prepared_data_dir: Path
) -> None:
    run_dir = run_dirs("run")
    ckpts = run_dir / "checkpoints"
    env = trainer_env_args()
    rc, a = cli(
        "launch", str(run_dir), "--wait", "180", *env, "--",
        *TRAIN, "--data-dir", str(prepared_data_dir), timeout=240,
    )  # fmt: skip
    assert rc == 0 and a.ok, a
    run_a = a.data["run_id"]
    assert _wait_finished(run_dir)["reason"] == "completed"
    assert is_complete(ckpts / run_a / "step_0000006")
    assert read_json(run_dir / "export" / "dflash_export.json")["run_id"] == run_a

    # A plain restart of the completed run keeps its max_steps: nothing to train, refused
    # before anything starts (it used to start a trainer that ended at once, and answer ok).
    six = ckpts / run_a / "step_0000006"
    stream, record = _stream(run_dir), read_json(run_dir / "run.json")
    rc, done = cli("restart", str(run_dir), "--wait", "180", timeout=240)
    assert rc == 1 and done.error_code == "nothing_to_train", done
    assert done.error == (
        f"resume_from: checkpoint {six} is at step 6, already at --max-steps 6: nothing to "
        f"train (raise --max-steps to train on, or export it: dflash-train export {six} "
        "--out DIR)"
    )
    assert _stream(run_dir) == stream and read_json(run_dir / "run.json") == record

    # Fresh: a new run id, A's checkpoints untouched, A's export beside them.
    rc, b = cli(
        "restart", str(run_dir), "--fresh", "--wait", "180", "--", "--max-steps", "4",
        timeout=240,
    )  # fmt: skip
    assert rc == 0 and b.ok, b
    run_b = b.data["run_id"]
    assert run_b != run_a and b.data["resumed_from"] is None
    previous = b.data["previous_run"]
    a_export = ckpts / run_a / "export"
    assert previous["run_id"] == run_a and previous["steps"] == [6]
    assert previous["newest"] == str(ckpts / run_a / "step_0000006")
    assert previous["export"] == str(a_export)
    record = read_json(run_dir / "run.json")
    assert record["checkpoints"]["dir"] == str(ckpts / run_b)
    assert [r["run_id"] for r in record["previous_runs"]] == [run_a]
    assert record["previous_runs"][0]["export"] == str(a_export)
    _wait_finished(run_dir)
    # B saved 3 and 4 with keep 1: its newest stays; A's step 6 (a higher step) stays too.
    assert sorted(p.name for p in (ckpts / run_b).iterdir() if p.name.startswith("step")) == [
        "step_0000004"
    ]
    assert is_complete(ckpts / run_a / "step_0000006")
    assert read_json(a_export / "dflash_export.json")["run_id"] == run_a
    assert read_json(run_dir / "export" / "dflash_export.json")["run_id"] == run_b
    _, status = cli("status", str(run_dir))
    assert status.data["checkpoints"]["newest"] == str(ckpts / run_b / "step_0000004")
    assert [(r["run_id"], r["export"]) for r in status.data["previous_runs"]] == [
        (run_a, str(a_export))
    ]

    # Resume: B's own newest checkpoint, under B's id, never A's step 6.
    rc, c = cli(
        "restart", str(run_dir), "--wait", "180", "--", "--max-steps", "1000",
        timeout=240,
    )  # fmt: skip
    assert rc == 0 and c.ok, c
    assert c.data["run_id"] == run_b and c.data["resumed_run"] == run_b
    assert c.data["resumed_from"] == str(ckpts / run_b / "step_0000004")
    start = [line for line in _stream(run_dir) if line.kind == "run_start"][-1]
    assert (start.run, start["start_step"], start["resumed_run"]) == (run_b, 4, run_b)
    assert start["resumed_from"] == str(ckpts / run_b / "step_0000004")

    # A resume with another block size is refused naming it, before B is stopped.
    pid = c.data["pid"]
    rc, d = cli("restart", str(run_dir), "--", "--block-size", "8", timeout=120)
    assert rc != 0 and d.error_code == "incompatible_checkpoint", d
    assert d.data["field"] == "block_size" and d.error and d.error.startswith("block_size: ")
    assert lock_is_held(run_dir / "run.lock") and read_json(run_dir / "run.json")["pid"] == pid
    rc, stop = cli("stop", str(run_dir), "--timeout", "120", timeout=180)
    assert rc == 0 and stop.ok and stop.data["pid"] == pid, stop
    assert is_complete(ckpts / run_a / "step_0000006")

    # Another run's checkpoint only when named, and the new run says whose it took; a launch
    # from it with no step left under --max-steps is refused before anything starts.
    a_six = ckpts / run_a / "step_0000006"
    record = read_json(run_dir / "run.json")
    rc, refused = cli(
        "launch", str(run_dir), *env, "--", *TRAIN, "--data-dir", str(prepared_data_dir),
        "--run-id", "runC", "--resume-from", str(a_six), timeout=120,
    )  # fmt: skip
    assert rc == 1 and refused.error_code == "nothing_to_train", refused
    assert (refused.error or "").startswith(
        f"resume_from: checkpoint {a_six} is at step 6, already at --max-steps 6: "
    )
    assert read_json(run_dir / "run.json") == record and not (ckpts / "runC").exists()
    rc, e = cli(
        "launch", str(run_dir), "--wait", "180", *env, "--", *TRAIN,
        "--data-dir", str(prepared_data_dir), "--run-id", "runC", "--resume-from", str(a_six),
        "--max-steps", "7", "--save-every", "1", timeout=240,
    )  # fmt: skip
    assert rc == 0 and e.ok, e
    _wait_finished(run_dir)
    start = [line for line in _stream(run_dir) if line.kind == "run_start"][-1]
    assert (start.run, start["resumed_run"], start["start_step"]) == ("runC", run_a, 6)
    assert start["resumed_from"] == str(a_six)
    assert is_complete(ckpts / "runC" / "step_0000007") and is_complete(a_six)
