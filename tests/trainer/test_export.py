"""Export in the z-lab layout: names, config, atomic output, reload gives the same logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from drafter_fixtures import frozen_head, random_context, tiny_drafter
from safetensors import safe_open

from dflash_train import protocol
from dflash_train.checkpoint import store as checkpoints
from dflash_train.checkpoint.export import (
    EXPORT_CONFIG,
    EXPORT_WEIGHTS,
    export_checkpoint,
    export_drafter,
    load_any_drafter,
    load_exported,
    resolve_export_source,
    servable,
)
from dflash_train.model.drafter import DFlashDrafter


def _save_run_checkpoint(run_dir: Path, drafter: DFlashDrafter, step: int) -> Path:
    """A real checkpoint, written by the trainer's own save path."""
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    state = checkpoints.TrainState(step=step, epoch=0, consumed=[], tokens_seen=0, run_id="r")
    return checkpoints.save_checkpoint(
        run_dir / "checkpoints",
        drafter=drafter,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        rng=checkpoints.capture_rng([]),
        keep=3,
    )


def _logits(drafter: DFlashDrafter) -> torch.Tensor:
    embed, head = frozen_head()
    anchors = torch.tensor([[1, 5], [0, 3]])
    blocks = drafter.embed_blocks(embed, torch.tensor([[4, 5], [6, 7]]))
    with torch.no_grad():
        return head(drafter(blocks, random_context(2, 10), anchors))


def _cli(*args: str) -> tuple[int, protocol.Reply]:
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_train", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    reply = protocol.decode_reply(proc.stdout)
    assert isinstance(reply, protocol.Reply), (proc.stdout, proc.stderr)
    return proc.returncode, reply


def test_export_layout_and_config(tmp_path: Path) -> None:
    drafter = tiny_drafter(num_layers=2, mask_mode="token", mask_token_id=7)
    out = export_drafter(drafter, tmp_path / "export", dtype="bfloat16")
    assert sorted(p.name for p in out.iterdir()) == sorted([EXPORT_CONFIG, EXPORT_WEIGHTS])
    config = json.loads((out / EXPORT_CONFIG).read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3" and config["num_hidden_layers"] == 2
    assert config["block_size"] == 4 and config["num_target_layers"] == 6
    assert config["dflash_config"]["target_layer_ids"] == [1, 3]
    assert config["dflash_config"]["mask_token_id"] == 7
    assert config["dflash_config"]["mask_mode"] == "token"
    assert config["dtype"] == "bfloat16"
    with safe_open(str(out / EXPORT_WEIGHTS), "pt") as weights:
        names = set(weights.keys())
        assert weights.get_tensor("fc.weight").dtype == torch.bfloat16
    assert names == set(drafter.state_dict())
    assert "layers.1.self_attn.q_norm.weight" in names and "hidden_norm.weight" in names


def test_export_then_reload_gives_identical_logits(tmp_path: Path) -> None:
    drafter = tiny_drafter(num_layers=2)
    out = export_drafter(drafter, tmp_path / "f32", dtype="float32")
    reloaded = load_exported(out)
    assert reloaded.config == drafter.config
    assert torch.equal(_logits(reloaded), _logits(drafter))
    # bf16 export: identical to the drafter rounded to bf16 the same way.
    out = export_drafter(drafter, tmp_path / "bf16", dtype="bfloat16")
    rounded = tiny_drafter(num_layers=2)
    rounded.load_state_dict({k: v.bfloat16().float() for k, v in drafter.state_dict().items()})
    assert torch.equal(_logits(load_exported(out)), _logits(rounded))


def test_learned_mask_travels_in_the_export(tmp_path: Path) -> None:
    drafter = tiny_drafter()
    out = export_drafter(drafter, tmp_path / "e", dtype="float32")
    config = json.loads((out / EXPORT_CONFIG).read_text())
    assert config["dflash_config"]["mask_mode"] == "learned"
    assert config["dflash_config"]["mask_token_id"] is None
    assert torch.equal(load_exported(out).mask_embedding, drafter.mask_embedding)


def test_export_replaces_an_older_export_whole(tmp_path: Path) -> None:
    dest = tmp_path / "export"
    export_drafter(tiny_drafter(seed=1), dest, dtype="float32")
    (dest / "stale.txt").write_text("old")
    newer = tiny_drafter(seed=2)
    export_drafter(newer, dest, dtype="float32")
    assert sorted(p.name for p in dest.iterdir()) == sorted([EXPORT_CONFIG, EXPORT_WEIGHTS])
    assert torch.equal(_logits(load_exported(dest)), _logits(newer))
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no temp dirs left


def test_run_dir_resolves_to_its_newest_complete_checkpoint(tmp_path: Path) -> None:
    older, newer = tiny_drafter(seed=1), tiny_drafter(seed=2)
    _save_run_checkpoint(tmp_path, older, 10)
    newest = _save_run_checkpoint(tmp_path, newer, 20)
    # A half-written later checkpoint (no completion marker) is ignored.
    (tmp_path / "checkpoints" / "step_0000030").mkdir()
    assert resolve_export_source(tmp_path) == newest
    assert resolve_export_source(newest) == newest
    out = export_checkpoint(tmp_path, tmp_path / "export", dtype="float32")
    assert torch.equal(_logits(load_exported(out)), _logits(newer))
    assert torch.equal(_logits(load_any_drafter(tmp_path)), _logits(newer))
    assert torch.equal(_logits(load_any_drafter(out)), _logits(newer))


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing", "is not a directory"),
        (lambda p: p, "neither a run directory nor a drafter checkpoint"),
        (lambda p: (p / "checkpoints").mkdir() or p, "no complete checkpoint"),
        (lambda p: (p / "status.jsonl").touch() or p, "is a run directory with no checkpoint"),
    ],
)
def test_bad_sources_are_named(tmp_path: Path, make, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=needle):
        resolve_export_source(make(tmp_path))


def test_cli_exports_a_run_dir(tmp_path: Path) -> None:
    drafter = tiny_drafter(num_layers=1)
    _save_run_checkpoint(tmp_path, drafter, 5)
    code, reply = _cli("export", str(tmp_path), "--dtype", "float32")
    assert code == 0 and reply.ok and reply.command == "export"
    assert reply.data["path"] == str(tmp_path / "export")
    assert reply.data["checkpoint"].endswith("step_0000005")
    assert torch.equal(_logits(load_exported(tmp_path / "export")), _logits(drafter))


def test_cli_reports_bad_input_in_one_line(tmp_path: Path) -> None:
    code, reply = _cli("export", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert code == 2 and not reply.ok and reply.error_code == "bad_source"
    assert "nope" in (reply.error or "") and "\n" not in (reply.error or "")
    checkpoint = _save_run_checkpoint(tmp_path, tiny_drafter(), 1)
    code, reply = _cli("export", str(checkpoint))
    assert code == 2 and reply.error == "out: required for a checkpoint"
    assert not (tmp_path / "o").exists()


def test_cli_says_whether_engines_can_serve_the_export(tmp_path: Path) -> None:
    learned = tmp_path / "learned"
    _save_run_checkpoint(learned, tiny_drafter(num_layers=1), 5)  # --mask-token learned
    code, reply = _cli("export", str(learned), "--dtype", "float32")
    assert code == 0 and reply.ok and reply.data["servable"] is False
    assert "not servable" in reply.data["message"] and "mask_token_id" in reply.data["message"]
    # The same judgement, in process (one CLI start is enough): a token mask is servable.
    assert servable(tiny_drafter(mask_mode="token", mask_token_id=7).config) is None
    assert servable(tiny_drafter(mask_mode="token", mask_token_id=40).config)  # out of range
