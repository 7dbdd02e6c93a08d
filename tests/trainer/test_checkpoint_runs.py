"""Checkpoints belong to a run: two runs in one run dir never prune, resume or overwrite each
other's checkpoints or exports, and a checkpoint of another shape is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drafter_fixtures import tiny_drafter

from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.checkpoint import store as checkpoints
from dflash_train.checkpoint.export import export_checkpoint
from dflash_train.checkpoint.layout import (
    IncompatibleCheckpoint,
    check_compatible,
    check_run_id,
    checkpoint_facts,
    newest_of_run,
    resolve_resume,
    run_folder,
    run_layout,
)


def _save(run_dir: Path, run_id: str, step: int, *, keep: int = 3, flat: bool = False) -> Path:
    """A real checkpoint of run `run_id`, through the trainer's own save path (`flat`: the
    layout of earlier versions, straight into checkpoints/)."""
    root = run_dir / "checkpoints"
    drafter = tiny_drafter(num_layers=1, mask_mode="token", mask_token_id=3)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    state = checkpoints.TrainState(
        step=step, epoch=0, consumed=[], tokens_seen=0, run_id=run_id, target="random:tiny"
    )
    return checkpoints.save_checkpoint(
        root if flat else run_folder(root, run_id),
        drafter=drafter,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        rng=checkpoints.capture_rng([]),
        keep=keep,
    )


def _steps(run_dir: Path, run_id: str) -> list[int]:
    return [s for s, _ in checkpoint_layout.run_checkpoints(run_dir / "checkpoints", run_id)]


def test_a_fresh_run_never_prunes_or_resumes_the_old_runs_checkpoints(tmp_path: Path) -> None:
    # The case: run A ended at 20 and 24; run B, started fresh in the same dir with
    # keep 1, saves 4 and 8. Pruning by step across runs deleted both of B's at once.
    for step in (20, 24):
        _save(tmp_path, "runA", step, keep=2)
    root = tmp_path / "checkpoints"
    assert resolve_resume("latest", root, "runB") is None  # B has none: never A's
    for step in (4, 8):
        _save(tmp_path, "runB", step, keep=1)
    assert _steps(tmp_path, "runA") == [20, 24]
    assert _steps(tmp_path, "runB") == [8]
    assert resolve_resume("latest", root, "runB") == root / "runB" / "step_0000008"
    assert resolve_resume("latest", root, "runA") == root / "runA" / "step_0000024"
    # Another run's checkpoint only when named.
    named = resolve_resume(str(root / "runA" / "step_0000020"), root, "runB")
    assert named is not None and checkpoints.recorded_run(named) == "runA"


def test_the_newest_written_checkpoint_is_never_pruned(tmp_path: Path) -> None:
    # A run resumed from an earlier checkpoint of its own writes lower steps than the ones
    # it abandoned: the new ones are its state and must survive keep=1.
    for step in (10, 20):
        _save(tmp_path, "r", step, keep=2)
    _save(tmp_path, "r", 12, keep=1)
    assert _steps(tmp_path, "r") == [12]
    assert newest_of_run(tmp_path / "checkpoints", "r") == run_folder(
        tmp_path / "checkpoints", "r"
    ) / ("step_0000012")


def test_flat_checkpoints_of_earlier_versions_keep_their_owner(tmp_path: Path) -> None:
    _save(tmp_path, "old", 5, flat=True)
    _save(tmp_path, "old", 7, flat=True)
    _save(tmp_path, "new", 1, keep=1)
    assert _steps(tmp_path, "old") == [5, 7]  # found, still resumable, never pruned
    assert _steps(tmp_path, "new") == [1]
    layout = run_layout(tmp_path, "new")
    assert [r["run_id"] for r in layout["previous_runs"]] == ["old"]
    assert layout["previous_runs"][0]["newest"].endswith("checkpoints/step_0000007")


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("target_model", {"target_model": "smollm2"}),
        ("hidden_size", {"hidden_size": 576}),
        ("target_layers", {"target_layers": [2, 4]}),
        ("block_size", {"block_size": 16}),
        ("draft_layers", {"draft_layers": 5}),
    ],
)
def test_an_incompatible_checkpoint_is_refused_naming_the_field(
    tmp_path: Path, field: str, change: dict[str, object]
) -> None:
    path = _save(tmp_path, "r", 3)
    saved = checkpoint_facts(path)
    assert saved["target_model"] == "random:tiny" and saved["block_size"] == 4
    same = {k: saved[k] for k in checkpoint_layout.COMPATIBLE_FIELDS}
    check_compatible("it", saved, same)  # the same shape passes
    with pytest.raises(IncompatibleCheckpoint, match=f"^{field}: ") as caught:
        check_compatible(f"checkpoint {path}", saved, {**same, **change})
    assert caught.value.field == field


def test_an_export_of_another_run_is_moved_aside_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "runA"}))
    _save(tmp_path, "runA", 6)
    first = export_checkpoint(tmp_path, tmp_path / "export")
    assert json.loads((first / "dflash_export.json").read_text())["run_id"] == "runA"
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "runB"}))
    _save(tmp_path, "runB", 2)
    export_checkpoint(tmp_path, tmp_path / "export")
    aside = tmp_path / "checkpoints" / "runA" / "export"
    assert json.loads((aside / "dflash_export.json").read_text())["run_id"] == "runA"
    assert (aside / "model.safetensors").is_file()
    info = json.loads((tmp_path / "export" / "dflash_export.json").read_text())
    assert info["run_id"] == "runB" and info["checkpoint"].endswith("runB/step_0000002")
    layout = run_layout(tmp_path, "runB")
    assert layout["checkpoints"]["newest"].endswith("runB/step_0000002")
    (previous,) = layout["previous_runs"]
    assert previous["run_id"] == "runA" and previous["export"] == str(aside)


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "-x", "x" * 65, "a b"])
def test_a_run_id_must_be_a_plain_folder_name(bad: str) -> None:
    with pytest.raises(ValueError, match="run_id: "):
        check_run_id(bad)


def test_an_export_of_unknown_origin_is_kept_too(tmp_path: Path) -> None:
    # Written by an earlier version: no dflash_export.json says whose it is.
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    _save(tmp_path, "runB", 2)
    export_checkpoint(tmp_path, tmp_path / "export")
    assert (tmp_path / "export.before-runB" / "config.json").read_text() == "{}"
    assert checkpoint_layout.export_owner(tmp_path / "export") == "runB"
