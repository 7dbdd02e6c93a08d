"""Checkpoints on disk: keep-K pruning, completeness, and a real SIGKILL of the trainer in
the middle of a save, which must leave the previous checkpoint the one that loads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from train_process import run_train, start_train, status_lines, train_argv

from dflash_train.checkpoint import store as checkpoints
from dflash_train.checkpoint.store import (
    STALL_ENV,
    TrainState,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)
from dflash_train.model.drafter import DFlashConfig, DFlashDrafter, load_drafter


def _tiny_drafter() -> DFlashDrafter:
    config = DFlashConfig(
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
        intermediate_size=32, rms_norm_eps=1e-6, rope_theta=10000.0, block_size=4,
        target_layer_ids=(1,), num_target_layers=4, mask_token_id=None, mask_mode="learned",
        max_position=256, vocab_size=50,
    )  # fmt: skip
    return DFlashDrafter(config)


def _save(root: Path, step: int, keep: int, within: Path | None = None) -> Path:
    drafter = _tiny_drafter()
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = TrainState(step=step, epoch=0, consumed=[3, 1], tokens_seen=10 * step, run_id="r")
    return save_checkpoint(
        root,
        drafter=drafter,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        rng=checkpoints.capture_rng([torch.device("cpu")]),
        keep=keep,
        within=within,
    )


def test_keep_k_prunes_oldest_and_round_trips(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (5, 10, 15, 20):
        _save(root, step, keep=2)
    assert [s for s, _ in list_checkpoints(root)] == [15, 20]
    assert sorted(p.name for p in root.iterdir()) == ["step_0000015", "step_0000020"]
    loaded = load_checkpoint(resolve_resume("latest", root))
    assert loaded.state.step == 20 and loaded.state.consumed == [3, 1]
    assert loaded.state.tokens_seen == 200 and "state" in loaded.optimizer
    # RNG states come back exactly.
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    saved = checkpoints.capture_rng([torch.device("cpu")])
    torch.rand(5)
    checkpoints.restore_rng(saved)
    assert torch.equal(torch.rand(3), expected)


def test_a_checkpoint_never_recreates_its_deleted_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    folder = run_dir / "checkpoints" / "r"
    first = _save(folder, 5, keep=2, within=run_dir)  # the folders below the run dir: made
    assert [s for s, _ in list_checkpoints(folder)] == [5] and first.parent == folder
    shutil.rmtree(run_dir)  # deleted under the live trainer (an epoch's end saves next)
    with pytest.raises(FileNotFoundError, match=r"run dir .* is gone"):
        _save(folder, 10, keep=2, within=run_dir)
    assert not run_dir.exists()


def test_incomplete_checkpoints_are_never_picked(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    good = _save(root, 1, keep=5)
    truncated = _save(root, 2, keep=5)
    weights = truncated / "drafter.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    unmarked = _save(root, 3, keep=5)
    (unmarked / checkpoints.COMPLETE_MARKER).unlink()
    assert latest_checkpoint(root) == good
    assert not is_complete(truncated) and not is_complete(unmarked)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        resolve_resume(str(unmarked), root)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_resume("latest", tmp_path / "empty")


def test_sigkill_during_a_save_keeps_the_previous_checkpoint(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    argv = train_argv(
        "random:tiny", prepared_data_dir, run_dir,
        "--pipeline", "sync", "--max-steps", "6", "--epochs", "20", "--save-every", "2",
        "--run-id", "killed",
    )  # fmt: skip
    # The stall sits inside the real save path, after every file of step 4 is written and
    # before its completion marker and rename: the worst moment to die.
    proc = start_train(argv, log, **{STALL_ENV: "4"})
    root = run_dir / "checkpoints" / "killed"  # the run's own folder
    partial = root / ".tmp-step_0000004"
    try:
        deadline = time.monotonic() + 180
        while not (partial / checkpoints.STATE_FILE).exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the save of step 4 never started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(p.name for p in root.iterdir()) == [".tmp-step_0000004", "step_0000002"]
    assert not is_complete(partial)
    latest = latest_checkpoint(root)
    assert latest is not None and latest.name == "step_0000002"
    assert load_checkpoint(latest).state.step == 2
    assert all(p.isfinite().all() for p in load_drafter(latest).parameters())
    assert status_lines(run_dir)[-1].kind != "run_end"  # a SIGKILL leaves no last word

    resumed = run_train([*argv, "--resume-from", "latest"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = status_lines(run_dir)
    start = [line for line in lines if line.kind == "run_start"][-1]
    assert start["start_step"] == 2
    assert [s for s, _ in list_checkpoints(root)][-1] == 6
    assert not partial.exists()  # the stale temp dir was replaced, then cleared
    state = json.loads((root / "step_0000006" / checkpoints.STATE_FILE).read_text())
    assert state["step"] == 6 and lines[-1]["reason"] == "completed"
