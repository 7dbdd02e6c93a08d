"""One run's checkpoints as `dflash-train status` lists them for the console: every step
folder of the run (complete or not, and a save in progress), with its size and when it was
completed. Which folders are the run's is checkpoint_layout's to say."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.checkpoint import store as checkpoints
from dflash_train.checkpoint.heldout_score import best_of, read_score

TEMP_PREFIX = ".tmp-"  # checkpoints.save_checkpoint writes into .tmp-step_N first


def _size(path: Path) -> int:
    total = 0
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def _step(path: Path) -> int | None:
    name = path.name.removeprefix(TEMP_PREFIX)
    if not checkpoints.is_step_dir(path.with_name(name)):
        return None
    return int(name.removeprefix("step_"))


def _scored(path: Path) -> dict[str, Any]:
    score = read_score(path) or {}
    return {"tau": score.get("tau"), "tau_tf": score.get("tau_tf")}


def checkpoint_list(run_dir_root: Path, run_id: str | None) -> list[dict[str, Any]]:
    """Run `run_id`'s checkpoints, oldest step first: step, path, size_bytes, complete,
    written_at (when its marker was written; for an incomplete one, its last change),
    tau and tau_tf (its held-out evaluation, null when it has none) and best (the
    highest held-out tau of the run's complete checkpoints)."""
    if not run_id or not checkpoint_layout.RUN_ID.fullmatch(run_id):
        return []
    root = run_dir_root / "checkpoints"
    found = {path for _, path in checkpoint_layout.run_checkpoints(root, run_id)}
    folder = checkpoint_layout.run_folder(root, run_id)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        found |= {
            child for child in folder.iterdir() if child.is_dir() and _step(child) is not None
        }
    listed = []
    best = best_of(p for p in found if checkpoints.is_complete(p))
    for path in found:
        step = _step(path)
        if step is None:
            continue
        complete = checkpoints.is_complete(path)
        written = checkpoints.write_order(path)[0] if complete else None
        if not written:
            try:
                written = path.stat().st_mtime
            except OSError:
                written = None
        listed.append(
            {
                "step": step,
                "path": str(path),
                "size_bytes": _size(path),
                "complete": complete,
                "written_at": written,
                **_scored(path),
                "best": best is not None and best[0] == path,
            }
        )
    return sorted(listed, key=lambda c: (c["step"], c["written_at"] or 0.0))
