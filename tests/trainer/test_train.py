"""The real `dflash-train train` on the CPU with the real SmolLM2 target: the stream it
writes, checkpoints, export, W&B offline figures, startup errors and argument errors."""

from __future__ import annotations

import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
from train_process import losses_by_step, run_train, start_train, status_lines, train_argv, wait_for

from dflash_train.rundir import lock_is_held

SYNC_ARGS = ("--pipeline", "sync", "--max-steps", "4")


@pytest.fixture(scope="module")
def sync_run(
    tmp_path_factory: pytest.TempPathFactory, prepared_data_dir: Path, smollm2_spec: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One plain sync run, read by the stream test and the distillation test's comparison."""
    run_dir = tmp_path_factory.mktemp("sync") / "run"
    argv = train_argv(
        smollm2_spec,
        prepared_data_dir,
        run_dir,
        *SYNC_ARGS,
        "--save-every", "2",
        "--keep-checkpoints", "1",
        "--run-id", "syncrun",
        "--wandb-project", "dflash-test",
    )  # fmt: skip
    return run_dir, run_train(argv, WANDB_API_KEY_UNUSED="1")


def test_sync_run_writes_the_stream_checkpoints_and_wandb(
    sync_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    run_dir, done = sync_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert "samples loaded" in done.stderr
    assert "Batches per epoch:" in done.stderr
    lines = status_lines(run_dir)
    kinds = [line.kind for line in lines]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert [line.seq for line in lines] == list(range(len(lines)))
    start = lines[0]
    assert start.run == "syncrun" and start["pid"] > 0 and start["host"]
    assert start["total_steps"] == 4 and start["batches_per_epoch"] >= 1
    assert start["topology"]["drafter"] == ["cpu"] and start["topology"]["pipeline"] == "sync"
    assert start["dataset"]["samples"] > 0 and 0 < start["dataset"]["padding_efficiency"] <= 1
    assert start["config"]["max_steps"] == 4
    steps = [line for line in lines if line.kind == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["loss"] > 0 and s["ktok_s"] > 0 and s["tokens"] > 0 for s in steps)
    peak = max(s["lr"] for s in steps)
    assert peak > 0 and steps[-1]["lr"] < peak  # warmup, then cosine decay
    saved = [line["step"] for line in lines if line.kind == "checkpoint"]
    assert saved == [2, 4]
    # The run's own folder; keep 1 pruned step 2.
    assert sorted(p.name for p in (run_dir / "checkpoints" / "syncrun").iterdir()) == [
        "step_0000004"
    ]
    end = lines[-1]
    assert end["reason"] == "completed" and end["exit_code"] == 0
    assert not lock_is_held(run_dir / "run.lock")
    exported = [line for line in lines if line.get("code") in ("exported", "export_failed")]
    assert exported and exported[0]["code"] == "exported", exported
    assert (run_dir / "export" / "config.json").is_file()
    # The same figures went to W&B (offline, no key) under the same steps.
    from wandb_records import history_rows

    rows = [r for r in history_rows(run_dir) if "train/loss" in r]
    assert {r["_step"]: r["train/loss"] for r in rows} == losses_by_step(lines)


def test_foreground_train_prints_a_progress_line_per_step_line(
    sync_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, done = sync_run
    lines = [line for line in done.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "3/4", "4/4"], done.stderr
    assert all(" loss " in line and " Ktok/s " in line for line in lines)
    assert lines[0].endswith("ETA —") and lines[-1].endswith("ETA 0s")


def test_async_run_answers_control_holds_the_lock_and_stops_on_sigterm(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    from dflash_train import protocol
    from dflash_train.rundir import atomic_write_text

    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    control = run_dir / "control.json"
    run_dir.mkdir()
    # A revision left by an earlier run must not be answered by this one.
    atomic_write_text(control, protocol.ControlFile(5, {"hs_min_ready": 1}).to_json())
    argv = train_argv(
        smollm2_spec,
        prepared_data_dir,
        run_dir,
        "--pipeline", "async",
        "--target-gpus", "cpu,cpu",
        "--hs-queue-depth", "4",
        "--hs-min-ready", "2",
        "--epochs", "50",
        "--save-every", "0",
    )  # fmt: skip
    proc = start_train(argv, log, DFLASH_RUN_ID="asyncrun")
    try:
        start = wait_for(run_dir, lambda line: line.kind == "run_start", proc, log)
        assert start.run == "asyncrun" and start["topology"]["target"] == ["cpu", "cpu"]
        loads = start["topology"]["target_load_s"]
        assert len(loads) == 2 and all(seconds > 0 for seconds in loads), loads
        assert start["settings"] == {"hs_queue_depth": 4, "hs_min_ready": 2}
        assert lock_is_held(run_dir / "run.lock")
        second = run_train(train_argv(smollm2_spec, prepared_data_dir, run_dir), timeout=60)
        assert second.returncode == 3 and "run.lock is held" in second.stderr

        atomic_write_text(control, protocol.ControlFile(6, {"hs_min_ready": 4}).to_json())
        applied = wait_for(run_dir, lambda line: line.get("rev") == 6, proc, log)
        assert applied["code"] == "control_applied" and applied["message"] == "hs_min_ready=4"
        atomic_write_text(control, protocol.ControlFile(7, {"hs_queue_depth": 2}).to_json())
        rejected = wait_for(run_dir, lambda line: line.get("rev") == 7, proc, log)
        assert rejected["code"] == "control_rejected"
        assert "hs_queue_depth: 2 is below hs_min_ready=4" in rejected["message"]
        wait_for(
            run_dir,
            lambda line: line.kind == "queue" and line["hs_min_ready"] == 4,
            proc,
            log,
        )
        wait_for(run_dir, lambda line: line.kind == "step" and line["step"] >= 2, proc, log)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = status_lines(run_dir)
    assert not any(line.get("rev") == 5 for line in lines)
    end = lines[-1]
    assert end.kind == "run_end" and end["reason"] == "signal" and end["exit_code"] == 0
    last_step = max(line["step"] for line in lines if line.kind == "step")
    checkpoint = [line for line in lines if line.kind == "checkpoint"][-1]
    assert checkpoint["step"] == last_step == end["step"]
    assert Path(checkpoint["path"]).name == f"step_{last_step:07d}"
    queue = [line for line in lines if line.kind == "queue"]
    assert all(q["pipeline"] == "async" and q["hs_ready"] <= q["hs_queue_depth"] for q in queue)
    assert "SIGTERM received" in log.read_text()
    assert not lock_is_held(run_dir / "run.lock")


def test_startup_failure_ends_the_stream_with_an_error(tmp_path: Path, smollm2_spec: str) -> None:
    run_dir = tmp_path / "run"
    done = run_train(train_argv(smollm2_spec, tmp_path / "no-such-data", run_dir), timeout=120)
    assert done.returncode == 1
    lines = status_lines(run_dir)
    assert [line.kind for line in lines] == ["run_end"]
    assert lines[0]["reason"] == "error" and lines[0]["exit_code"] == 1
    assert "no-such-data" in lines[0]["error_tail"]
    # On the terminal, one line that names the input, not a traceback.
    assert done.stderr.strip().splitlines()[-1] == (
        f"dflash-train train: data dir {tmp_path / 'no-such-data'}: not a directory"
    )
    assert "Traceback" not in done.stderr


def test_bad_arguments_are_refused_in_one_line(tmp_path: Path, prepared_data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    base = train_argv("smollm2", prepared_data_dir, run_dir)
    done = run_train([*base, "--hs-queue-depth", "4", "--hs-min-ready", "9"], timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dflash-train train: hs_min_ready: 9 is out of range 1..hs_queue_depth=4"
    ]
    done = run_train([*base, "--drafter-gpus", "gpu0"], timeout=60)
    assert done.returncode == 2 and "'gpu0' is not a device" in done.stderr
    done = run_train([*base, "--distill", "1.5"], timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dflash-train train: distill (--distill): 1.5 is out of range 0..1"
    ]
    assert not (run_dir / "status.jsonl").exists()


def test_distilled_run_feeds_the_targets_last_layer_to_the_loss(
    tmp_path: Path,
    prepared_data_dir: Path,
    smollm2_spec: str,
    sync_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """--distill: the target's final layer is extracted beside the context layers, the
    drafter still gets only its own, and the loss reads the target's logits."""
    run_dir = tmp_path / "run"
    argv = train_argv(smollm2_spec, prepared_data_dir, run_dir, *SYNC_ARGS, "--distill", "0.5")
    done = run_train(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = status_lines(run_dir)
    assert lines[0]["config"]["distill"] == 0.5 and lines[-1]["reason"] == "completed"
    base = losses_by_step(status_lines(sync_run[0]))
    got = losses_by_step(lines)
    assert sorted(got) == sorted(base) == [1, 2, 3, 4]
    # Step 1 of both: the same weights, batch and anchors (sync pipeline, same seed), so
    # only the labels differ.
    assert got[1] != base[1] and all(math.isfinite(v) for v in got.values())


def test_non_finite_steps_stop_the_run_and_keep_the_last_good_checkpoint(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    # An absurd learning rate blows the weights up after the first update, so every later
    # step is non-finite: real arithmetic, no injection. The target's weights do not matter
    # here, so the quick random tiny one stands in for SmolLM2.
    argv = train_argv(
        "random:tiny",
        prepared_data_dir,
        run_dir,
        "--pipeline", "sync",
        "--lr", "1e30",
        "--warmup-ratio", "0",
        "--save-every", "1",
        "--max-bad-steps", "3",
        "--epochs", "20",
    )  # fmt: skip
    secret = "wandb-key-that-must-not-leak"
    done = run_train(argv, WANDB_API_KEY=secret)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = status_lines(run_dir)
    end = lines[-1]
    assert end.kind == "run_end" and end["reason"] == "error"
    written = [p.read_bytes() for p in run_dir.rglob("*") if p.is_file()]
    assert not any(secret.encode() in blob for blob in written) and secret not in done.stderr
    assert "non-finite steps in a row" in end["error_tail"]
    bad = [line for line in lines if line.get("code") == "nonfinite_step"]
    assert bad and all(line["level"] == "error" for line in bad)
    steps = [line for line in lines if line.kind == "step"]
    first_bad = min(s["step"] for s in steps if s["bad_steps"])
    saved = [line["step"] for line in lines if line.kind == "checkpoint"]
    assert max(saved) >= first_bad - 1
    # Skipped steps never changed the weights, so every checkpoint holds finite weights.
    from dflash_train.checkpoint.store import latest_checkpoint
    from dflash_train.model.drafter import load_drafter

    own = run_dir / "checkpoints" / lines[0].run
    drafter = load_drafter(latest_checkpoint(own))  # type: ignore[arg-type]
    assert all(p.isfinite().all() for p in drafter.parameters())


def test_sigterm_during_start_up_ends_cleanly_without_a_checkpoint(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    import time

    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    proc = start_train(train_argv("random:tiny", prepared_data_dir, run_dir), log)
    try:
        deadline = time.monotonic() + 60
        while not lock_is_held(run_dir / "run.lock"):  # the lock is the first thing taken
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)  # still importing torch / loading the target
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = status_lines(run_dir)
    assert [line.kind for line in lines if line.kind != "queue" and line.kind != "gpu"] == [
        "run_start",
        "run_end",
    ]
    assert lines[-1]["reason"] == "signal" and lines[-1]["step"] == 0
    assert not (run_dir / "checkpoints").exists()
