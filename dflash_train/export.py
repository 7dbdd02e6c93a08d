"""Export a trained drafter in the z-lab DFlash layout (config.json + model.safetensors) that
inference engines load, and read such an export back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from dflash_train.drafter import CONFIG_FILE, DFlashConfig, DFlashDrafter, load_drafter

EXPORT_CONFIG = "config.json"
EXPORT_WEIGHTS = "model.safetensors"
EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_export_source(path: str | os.PathLike[str]) -> Path:
    """A checkpoint dir (holds drafter_config.json) is itself; a run dir means its newest
    complete checkpoint. Raises ValueError with a one-line reason."""
    from dflash_train.checkpoints import latest_checkpoint
    from dflash_train.rundir import RunDir

    source = Path(path).expanduser().absolute()
    if not source.is_dir():
        raise ValueError(f"source: {source} is not a directory")
    if (source / CONFIG_FILE).is_file():
        return source
    run = RunDir.at(source)
    if run.checkpoints.is_dir():
        newest = latest_checkpoint(run.checkpoints)
        if newest is None:
            raise ValueError(f"source: no complete checkpoint under {run.checkpoints}")
        return newest
    raise ValueError(f"source: {source} is neither a run directory nor a drafter checkpoint")


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
    drafter: DFlashDrafter, out: str | os.PathLike[str], dtype: str = "bfloat16"
) -> Path:
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
        tmp.chmod(0o755)
        _replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def export_checkpoint(
    source: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str = "bfloat16"
) -> Path:
    """Export a checkpoint dir, or a run dir's newest complete checkpoint."""
    checkpoint = resolve_export_source(source)
    return export_drafter(load_drafter(checkpoint, "cpu"), out, dtype)


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
    if (folder / EXPORT_CONFIG).is_file() and (folder / EXPORT_WEIGHTS).is_file():
        return load_exported(folder, device, dtype)
    return load_drafter(resolve_export_source(folder), device, dtype)
