"""The few things a trainer process takes from its environment besides training options
(those are read by loader.py): where models are cached, what W&B needs to find its key,
the environment a calibration run inherits, and a test hook. Reading them here, by name,
keeps `os.environ` out of the rest of dflash_train (launch builds the trainer's environment;
distributed.py passes ranks)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VAR = "DFLASH_CACHE_DIR"
# What wandb_log needs to tell where the key comes from (it never reads the key itself)
# and the mode the user asked for.
WANDB_VARS = ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE", "NETRC", "HOME")
# The run id launch hands a process it starts (a launched prepare reads it here; train reads
# it through its option table, loader.py).
RUN_ID_VAR = "DFLASH_RUN_ID"
# Tests only: a checkpoint save of this step stalls (checkpoints.py).
STALL_SAVE_VAR = "DFLASH_TEST_STALL_SAVE_AT_STEP"


def cache_dir_override() -> Path | None:
    value = os.environ.get(CACHE_DIR_VAR)
    return Path(value).expanduser().absolute() if value else None


def wandb_environment() -> dict[str, str]:
    return {name: os.environ[name] for name in WANDB_VARS if name in os.environ}


def run_id_override() -> str | None:
    return os.environ.get(RUN_ID_VAR) or None


def stall_save_at_step() -> str | None:
    return os.environ.get(STALL_SAVE_VAR)


def inherited_with(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment with `extra` on top: what a child it starts on this box
    (`plan --measure`'s calibration trainer) inherits."""
    return {**os.environ, **extra}
