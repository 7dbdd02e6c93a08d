"""Checks a launch makes before anything starts, each failure a named reason: train
arguments, target model, data dir, GPUs, output dir, free disk. Torch is never imported."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from dflash_train.config import ConfigError, ResolvedConfig, TrainConfig
from dflash_train.config.cli_options import resolve_train_args
from dflash_train.data.dir_specs import data_dir_specs, spec_parts
from dflash_train.rundir import RunDir
from dflash_train.targets.frozen_target import context_layer_count, target_layer_ids

# Bytes per drafter parameter in a checkpoint: fp32 weights plus AdamW's two moments.
CHECKPOINT_BYTES_PER_PARAM = 12
# Headroom over the estimate: the temp copy of a checkpoint lands before the old is pruned.
CHECKPOINT_HEADROOM = 2.0
MIN_FREE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class PreflightError(Exception):
    code: str
    message: str

    def __str__(self) -> str:
        return self.message


class ArgumentError(Exception):
    pass


class RaisingParser(argparse.ArgumentParser):
    """argparse that raises ArgumentError instead of printing usage and exiting: control
    commands answer bad input with a JSON reply."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message)


def resolve_launch_config(
    run_dir: RunDir, train_args: Sequence[str], environ: Mapping[str, str] | None = None
) -> ResolvedConfig:
    """The config `train TRAIN_ARGS --output-dir RUN_DIR` would run with in the environment
    `environ` (the trainer's), checked here so a typo is refused with its reason rather
    than found in train.log after the launch."""
    if any(a == "--output-dir" or a.startswith("--output-dir=") for a in train_args):
        raise PreflightError("bad_train_args", "--output-dir: set by launch from RUN_DIR")
    try:
        return resolve_train_args(train_args, environ=environ or {}, output_dir=str(run_dir.root))
    except ConfigError as exc:
        raise PreflightError("bad_train_args", f"train args: {exc}") from None


def check_target(spec: str) -> Any:
    from dflash_train.targets.frozen_target import resolve_target

    try:
        return resolve_target(spec)
    except ValueError as exc:
        raise PreflightError("target_not_found", str(exc)) from None


def _readable(path: Path, what: str) -> None:
    """A regular file we can read from. Opened without blocking: a FIFO or device in
    place of a file must not hang the preflight."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PreflightError("data_dir_unreadable", f"data_dir: {what} {path}: {reason}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PreflightError(
                "data_dir_unreadable", f"data_dir: {what} {path}: not a regular file"
            )
        os.read(fd, 8)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PreflightError("data_dir_unreadable", f"data_dir: {what} {path}: {reason}") from None
    finally:
        os.close(fd)


def _dataset_files(directory: Path) -> list[Path]:
    """A `save_to_disk` dataset's shard files, from its state.json."""
    state_file = directory / "state.json"
    for name in ("state.json", "dataset_info.json"):
        _readable(directory / name, "dataset file")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise PreflightError(
            "data_dir_unreadable", f"data_dir: {state_file} is not a dataset state ({exc})"
        ) from None
    if not names:
        raise PreflightError("data_dir_unreadable", f"data_dir: {directory} lists no shards")
    return [directory / name for name in names]


def check_data_dir(path: str) -> None:
    """Present and readable: state.json, dataset_info.json and every arrow shard (a split
    dataset: each split's). Contents are not validated, that is the loader's job."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise PreflightError("data_dir_unreadable", f"data_dir: {directory} is not a directory")
    splits_file = directory / "dataset_dict.json"
    if splits_file.is_file():
        try:
            splits = json.loads(splits_file.read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise PreflightError(
                "data_dir_unreadable", f"data_dir: {splits_file} is unreadable ({exc})"
            ) from None
        shards = [f for split in splits for f in _dataset_files(directory / split)]
    else:
        shards = _dataset_files(directory)
    for shard in shards:
        _readable(shard, "shard")


def check_init_from(config: TrainConfig) -> None:
    """--init-from's weights exist and have the run's shape (what the trainer checks first)."""
    from dflash_train.checkpoint.layout import find_init_source

    assert config.run.init_from is not None
    try:
        find_init_source(config.run.init_from, config)
    except ValueError as exc:
        raise PreflightError("bad_init_from", str(exc)) from None


def check_resume_from(run_dir: RunDir, config: TrainConfig) -> None:
    """--resume-from's checkpoint has steps left under --max-steps (what the trainer checks
    first): a trainer started on one at its end would exit at once, refused."""
    from dflash_train.checkpoint.layout import resume_refusal

    refusal = resume_refusal(config, run_dir.checkpoints)
    if refusal is not None:
        raise PreflightError("nothing_to_train", refusal)


def gpu_indices(devices: Sequence[str] | None) -> list[int]:
    """GPU indices named by a parsed device list ("cpu", "cuda:3")."""
    return sorted({int(d.split(":", 1)[1]) for d in devices or () if d.startswith("cuda:")})


def _holder(process: dict[str, Any]) -> str:
    """`pid 4242 python 0.9 GiB`: enough to tell whose process holds the GPU."""
    text = f"pid {process['pid']}"
    if process.get("name"):
        text += f" {process['name']}"
    if isinstance(process.get("gpu_mem"), (int, float)):
        text += f" {process['gpu_mem'] / 1024:.1f} GiB"
    return text


def check_gpus(indices: Sequence[int], *, allow_busy: bool) -> None:
    if not indices:
        return
    from dflash_train.gpu_telemetry import sample_gpus

    sample = sample_gpus()
    named = ",".join(str(i) for i in indices)
    if not sample["available"]:
        raise PreflightError("gpu_missing", f"gpus: cannot check GPU {named}: {sample['reason']}")
    present = {gpu["index"]: gpu for gpu in sample["gpus"]}
    missing = [i for i in indices if i not in present]
    if missing:
        found = ",".join(str(i) for i in sorted(present)) or "none"
        raise PreflightError(
            "gpu_missing", f"gpus: GPU {','.join(map(str, missing))} not found (present: {found})"
        )
    if allow_busy:
        return
    busy = {i: present[i]["processes"] for i in indices if present[i]["processes"]}
    if busy:
        detail = "; ".join(
            f"GPU {i}: " + ", ".join(_holder(p) for p in procs) for i, procs in busy.items()
        )
        raise PreflightError(
            "gpu_busy", f"gpus: in use by other processes ({detail}); --allow-busy to share"
        )


def check_output_dir(run_dir: RunDir) -> None:
    try:
        run_dir.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir.root, prefix=".preflight-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PreflightError(
            "output_not_writable", f"run_dir: cannot write in {run_dir.root}: {reason}"
        ) from None


def checkpoint_estimate(hidden_size: int, draft_layers: int, target_layers: int) -> int:
    """Bytes of one checkpoint, from the drafter's shape (Qwen3-style layers with an MLP
    of about 3x hidden and the fc over k target layers)."""
    per_layer = 4 * hidden_size * hidden_size + 3 * hidden_size * (3 * hidden_size)
    params = draft_layers * per_layer + target_layers * hidden_size * hidden_size
    return params * CHECKPOINT_BYTES_PER_PARAM


def check_disk(run_dir: RunDir, needed: int) -> int:
    free = shutil.disk_usage(run_dir.root).free
    if free < needed:
        raise PreflightError(
            "disk_full",
            f"run_dir: {free / 2**20:.0f} MiB free in {run_dir.root}, a checkpoint needs "
            f"about {needed / 2**20:.0f} MiB",
        )
    return free


def preflight_config(
    run_dir: RunDir, config: TrainConfig, *, allow_busy: bool, min_free_bytes: int | None
) -> None:
    """All checks of a checked config in the order an operator fixes them; raises
    PreflightError."""
    target = check_target(config.train.target_model)
    context_layers = context_layer_count(target.num_layers, config.model.target_layers)
    try:
        target_layer_ids(target.num_layers, context_layers)
    except ValueError as exc:
        raise PreflightError("bad_train_args", f"--target-layers: {exc}") from None
    for spec in data_dir_specs(config.train.data_dir):
        check_data_dir(spec_parts(spec)[0])
    if config.run.init_from and not config.run.resume_from:
        check_init_from(config)
    check_resume_from(run_dir, config)
    devices = [*(config.pipeline.target_gpus or ()), *(config.pipeline.drafter_gpus or ())]
    check_gpus(gpu_indices(devices), allow_busy=allow_busy)
    check_output_dir(run_dir)
    if min_free_bytes is None:
        estimate = checkpoint_estimate(
            target.hidden_size, config.model.draft_layers, context_layers
        )
        min_free_bytes = max(MIN_FREE_BYTES, int(estimate * CHECKPOINT_HEADROOM))
    check_disk(run_dir, min_free_bytes)
