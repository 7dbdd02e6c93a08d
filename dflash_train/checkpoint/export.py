"""Export a trained drafter in the z-lab DFlash layout (config.json + model.safetensors) that
inference engines load, and read such an export back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dflash_train.checkpoint.layout import EXPORT_CONFIG, EXPORT_WEIGHTS, weights_kind
from dflash_train.model.drafter import CONFIG_FILE, DFlashConfig, DFlashDrafter, load_drafter

EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_export_source(path: str | os.PathLike[str]) -> Path:
    """A checkpoint dir (holds drafter_config.json) is itself; a run dir means the newest
    complete checkpoint of its run (run.json's run id; without one, the run that wrote
    last). Raises ValueError with a one-line reason."""
    from dflash_train.checkpoint.layout import newest_of_run, runs_with_checkpoints
    from dflash_train.rundir import RunDir, read_json

    source = Path(path).expanduser().absolute()
    if not source.is_dir():
        raise ValueError(f"source: {source} is not a directory")
    if (source / CONFIG_FILE).is_file():
        return source
    run = RunDir.at(source)
    if run.checkpoints.is_dir():
        record = read_json(run.run_json)
        current = record.get("run_id") if isinstance(record, dict) else None
        runs = runs_with_checkpoints(run.checkpoints)
        run_id = current if isinstance(current, str) and current in runs else None
        run_id = run_id or (runs[-1] if runs else None)
        newest = newest_of_run(run.checkpoints, run_id) if run_id else None
        if newest is None:
            raise ValueError(f"source: no complete checkpoint under {run.checkpoints}")
        return newest
    if run.status.is_file() or run.run_json.is_file():
        # A run that never saved (stopped before its first checkpoint): session 40's export
        # of one was told it was no run directory at all.
        raise ValueError(f"source: {source} is a run directory with no checkpoint yet")
    raise ValueError(f"source: {source} is neither a run directory nor a drafter checkpoint")


def servable(config: DFlashConfig) -> str | None:
    """None when inference engines can serve the export; else the one-line reason."""
    token = config.mask_token_id
    if config.mask_mode == "token" and isinstance(token, int) and 0 <= token < config.vocab_size:
        return None
    return (
        "not servable: its mask is a learned vector (--mask-token learned), while the z-lab, "
        "vLLM and SGLang DFlash loaders take an integer mask_token_id of the target's table"
    )


def export_config(config: DFlashConfig, dtype: str) -> dict[str, Any]:
    """A Qwen3 config of the drafter plus the DFlash fields engines read."""
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "rope_theta": config.rope_theta,  # for loaders older than rope_parameters
        "max_position_embeddings": config.max_position,
        "vocab_size": config.vocab_size,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": False,
        "layer_types": ["full_attention"] * config.num_layers,
        "dtype": dtype,
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        "dflash_config": {
            "target_layer_ids": list(config.target_layer_ids),
            "mask_token_id": config.mask_token_id,
            # "learned": slots 1.. use the tensor `mask_embedding` in model.safetensors
            # instead of a row of the target's embedding table.
            "mask_mode": config.mask_mode,
            "block_size": config.block_size,
        },
    }


def config_from_export(record: dict[str, Any]) -> DFlashConfig:
    dflash = record.get("dflash_config") or {}
    rope = record.get("rope_parameters") or {}
    try:
        return DFlashConfig(
            hidden_size=int(record["hidden_size"]),
            num_layers=int(record["num_hidden_layers"]),
            num_heads=int(record["num_attention_heads"]),
            num_kv_heads=int(record["num_key_value_heads"]),
            head_dim=int(record["head_dim"]),
            intermediate_size=int(record["intermediate_size"]),
            rms_norm_eps=float(record["rms_norm_eps"]),
            rope_theta=float(rope.get("rope_theta", record.get("rope_theta", 1_000_000.0))),
            block_size=int(dflash.get("block_size", record["block_size"])),
            target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]),
            num_target_layers=int(record["num_target_layers"]),
            mask_token_id=dflash.get("mask_token_id"),
            mask_mode=str(dflash.get("mask_mode", "token")),
            max_position=int(record.get("max_position_embeddings", 32768)),
            vocab_size=int(record["vocab_size"]),
        )
    except KeyError as exc:
        raise ValueError(f"{EXPORT_CONFIG}: missing field {exc.args[0]!r}") from None


def _replace_dir(tmp: Path, out: Path) -> None:
    """Put the finished `tmp` at `out`; an older export there is removed only afterwards."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


def export_drafter(
    drafter: DFlashDrafter,
    out: str | os.PathLike[str],
    dtype: str = "bfloat16",
    *,
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write the export into a temp dir beside `out` (with `files`, name -> text, e.g. the
    run record), then put it in place whole."""
    from safetensors.torch import save_file

    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(EXPORT_DTYPES)}")
    dest = Path(out).expanduser().absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        # Parameter names already are the reference names: a copy, no renaming.
        tensors = {
            name: t.detach().to("cpu", EXPORT_DTYPES[dtype]).contiguous()
            for name, t in drafter.state_dict().items()
        }
        save_file(tensors, str(tmp / EXPORT_WEIGHTS), metadata={"format": "pt"})
        text = json.dumps(export_config(drafter.config, dtype), indent=2) + "\n"
        (tmp / EXPORT_CONFIG).write_text(text, encoding="utf-8")
        for name, content in (files or {}).items():
            (tmp / name).write_text(content + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        _replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def export_checkpoint(
    source: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str = "bfloat16"
) -> Path:
    """Export a checkpoint dir, or a run dir's newest complete checkpoint. An export that
    lands in a run dir's `export/` records the run it came from (checkpoint_layout.py)."""
    from dflash_train.checkpoint.layout import EXPORT_INFO, export_owner, set_aside_export
    from dflash_train.checkpoint.store import recorded_run

    checkpoint = resolve_export_source(source)
    dest = Path(out).expanduser().absolute()
    run_id = recorded_run(checkpoint)
    in_run_dir = dest.name == "export" and (dest.parent / "checkpoints").is_dir()
    if in_run_dir and run_id is not None and dest.is_dir() and export_owner(dest) != run_id:
        # Another run's export (or one of unknown origin, from an older version): kept, in
        # that run's checkpoint folder (else export.before-<run>), never overwritten.
        set_aside_export(dest.parent, run_id)
    drafter = load_drafter(checkpoint, "cpu")
    info = {
        "run_id": run_id,
        "checkpoint": str(checkpoint),
        "servable": servable(drafter.config) is None,
        "exported_at": time.time(),
    }
    return export_drafter(drafter, dest, dtype, files={EXPORT_INFO: json.dumps(info, indent=2)})


def load_exported(
    directory: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    from safetensors.torch import load_file

    folder = Path(directory)
    try:
        record = json.loads((folder / EXPORT_CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{folder / EXPORT_CONFIG}: not found") from None
    except ValueError as exc:
        raise ValueError(f"{folder / EXPORT_CONFIG}: malformed JSON ({exc})") from None
    drafter = DFlashDrafter(config_from_export(record))
    weights = {k: v.float() for k, v in load_file(str(folder / EXPORT_WEIGHTS)).items()}
    drafter.load_state_dict(weights)
    return drafter.to(device=device, dtype=dtype)


def load_any_drafter(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    """An export dir (config.json), a checkpoint dir, or a run dir (newest checkpoint)."""
    folder = Path(path).expanduser()
    if weights_kind(folder) == "export":
        return load_exported(folder, device, dtype)
    return load_drafter(resolve_export_source(folder), device, dtype)
