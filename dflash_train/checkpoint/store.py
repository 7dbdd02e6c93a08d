"""Atomic, self-describing training checkpoints: write into a temp dir, mark complete
last, rename into place, keep the newest K. Holds everything exact resume needs."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_train.config.environment import STALL_SAVE_VAR, stall_save_at_step

COMPLETE_MARKER = "complete"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d{7,})$")
# Test hook: stall the save of this step after its files are written and before the
# marker, so a test can SIGKILL the trainer inside the real save path.
STALL_ENV = STALL_SAVE_VAR
# Below this much free space after a failed save, the disk is what failed.
DISK_FULL_BYTES = 1 << 20


@dataclass(frozen=True)
class TrainState:
    """The loop's position. `consumed` lists the batch positions of `epoch` already trained
    on (out of order under the async pipeline's random draw)."""

    step: int
    epoch: int
    consumed: list[int]
    tokens_seen: int
    run_id: str
    settings: dict[str, int] = field(default_factory=dict)
    control_rev: int | None = None
    # The target model it was trained against (checkpoint_layout.target_identity), so a
    # resume against another target is refused before anything loads.
    target: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for child in path.iterdir():
        if child.is_file():
            with child.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def is_complete(path: Path) -> bool:
    """Complete means: the marker exists and every file it lists has the recorded size."""
    try:
        manifest = json.loads((path / COMPLETE_MARKER).read_text(encoding="utf-8"))
        files = manifest["files"]
        return all((path / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def is_step_dir(path: Path) -> bool:
    return _STEP_DIR.match(path.name) is not None


def write_order(path: Path) -> tuple[float, int]:
    """When a checkpoint was completed (its marker's time), then its step. "Newest" means
    last written, not highest step: a run resumed from an earlier checkpoint of its own
    writes lower steps than the abandoned ones, and those new ones are the run's state."""
    match = _STEP_DIR.match(path.name)
    step = int(match.group(1)) if match else -1
    try:
        written = float(json.loads((path / COMPLETE_MARKER).read_text("utf-8"))["written_at"])
    except (OSError, ValueError, KeyError, TypeError):
        written = 0.0
    return written, step


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints directly in `root` (one run's folder), oldest written first.
    Temp and partial dirs are ignored."""
    found: list[tuple[int, Path]] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir() and is_complete(child):
                found.append((int(match.group(1)), child))
    return sorted(found, key=lambda item: write_order(item[1]))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_resume(spec: str, checkpoints_root: Path) -> Path:
    """`latest` or a path; raises ValueError with a one-line reason."""
    if spec == "latest":
        path = latest_checkpoint(checkpoints_root)
        if path is None:
            raise ValueError(f"--resume-from latest: no complete checkpoint in {checkpoints_root}")
        return path
    path = Path(spec).expanduser().absolute()
    if not path.is_dir():
        raise ValueError(f"--resume-from: {path} is not a directory")
    if not is_complete(path):
        raise ValueError(f"--resume-from: {path} is not a complete checkpoint")
    return path


def capture_rng(devices: list[Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    cuda_indices = sorted({d.index for d in devices if d.type == "cuda"})
    state["cuda"] = {i: torch.cuda.get_rng_state(i) for i in cuda_indices}
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    for index, cuda_state in state.get("cuda", {}).items():
        if index < torch.cuda.device_count():
            torch.cuda.set_rng_state(cuda_state, index)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; its temp dir is gone, older ones are untouched."""


def _write_failure(root: Path, tmp: Path, step: int, exc: Exception) -> str:
    """Remove the half-written temp dir (it may be what fills the disk) and say why the
    save failed in one line. torch.save reports a full disk as a bare RuntimeError, so
    the free space is measured before cleaning up."""
    free = shutil.disk_usage(root).free
    shutil.rmtree(tmp, ignore_errors=True)
    full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    if full or free < DISK_FULL_BYTES:
        reason = f"no space left on the device of {root} ({free / 2**20:.1f} MiB free)"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    newest = latest_checkpoint(root)
    kept = f"{newest.name} is the newest complete one" if newest else "no complete one exists"
    return f"checkpoint at step {step} not written: {reason}; {kept}"


def _make_folder(root: Path, within: Path | None) -> None:
    if within is None:
        root.mkdir(parents=True, exist_ok=True)
        return
    if not within.is_dir():
        raise FileNotFoundError(f"run dir {within} is gone; checkpoint not written")
    folder = within
    for part in root.relative_to(within).parts:
        folder = folder / part
        folder.mkdir(exist_ok=True)  # never parents: `within` itself is not recreated


def save_checkpoint(
    root: Path,
    *,
    drafter: Any,
    optimizer: Any,
    scheduler: Any,
    state: TrainState,
    rng: dict[str, Any],
    keep: int,
    within: Path | None = None,
) -> Path:
    """Write checkpoint `state.step` into `root` (the run's own folder) and prune that
    folder to the newest `keep`. Returns its path. With `within` (the run dir), the
    folders below it are made but it never is: a run dir deleted under a live trainer
    gives FileNotFoundError instead of a stray directory of one checkpoint."""
    import torch

    from dflash_train.model.drafter import save_drafter

    _make_folder(root, within)
    final = root / step_dir_name(state.step)
    tmp = root / f".tmp-{step_dir_name(state.step)}"
    if tmp.exists():  # left by a process killed mid-save
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_drafter(drafter, tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng, tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
        if stall_save_at_step() == str(state.step):
            time.sleep(3600)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        marker = {"step": state.step, "files": files, "written_at": time.time()}
        _fsync_tree(tmp)
        # The marker goes in last: a dir without it (or with a short file) is never loaded.
        with (tmp / COMPLETE_MARKER).open("w", encoding="utf-8") as fh:
            json.dump(marker, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except Exception as exc:
        raise CheckpointWriteError(_write_failure(root, tmp, state.step, exc)) from exc
    if final.exists():  # a re-save of the same step (e.g. resume then immediate stop)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    prune_checkpoints(root, keep, run_id=state.run_id)
    return final


def prune_checkpoints(root: Path, keep: int, *, run_id: str | None = None) -> list[Path]:
    """Delete all but the newest `keep` (at least 1: the one just written) complete
    checkpoints in `root`, one run's folder, and stale temp dirs. With `run_id`, a
    checkpoint recording another run is never deleted, whatever folder it sits in. The
    one with the best held-out tau (heldout_score.py) is kept too, whatever its age."""
    from dflash_train.checkpoint.heldout_score import best_of

    removed: list[Path] = []
    found = list_checkpoints(root)
    if run_id is not None:
        found = [(s, p) for s, p in found if recorded_run(p) in (run_id, None)]
    best = best_of(p for _, p in found)
    for _, path in found[: max(0, len(found) - max(1, keep))]:
        if best is not None and path == best[0]:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    for stale in root.glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale)
    return removed


def recorded_run(path: Path) -> str | None:
    """The run id a checkpoint's trainer_state.json names."""
    try:
        run = json.loads((path / STATE_FILE).read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: Path
    state: TrainState
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]


def read_state(path: Path) -> TrainState:
    """A checkpoint's loop position alone (no tensors): what a resume plans its steps by."""
    return TrainState.from_dict(json.loads((path / STATE_FILE).read_text(encoding="utf-8")))


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read the trainer's parts of a checkpoint (the drafter is read with load_drafter)."""
    import torch

    if not is_complete(path):
        raise ValueError(f"{path} is not a complete checkpoint")
    state = read_state(path)
    # weights_only=False: the files are our own and hold Python RNG tuples and numpy state.
    return LoadedCheckpoint(
        path=path,
        state=state,
        optimizer=torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False),
        scheduler=torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False),
        rng=torch.load(path / "rng.pt", map_location="cpu", weights_only=False),
    )
