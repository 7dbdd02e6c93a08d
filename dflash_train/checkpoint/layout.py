"""Which checkpoints belong to which run, and whether one may be resumed.

Layout: `RUN_DIR/checkpoints/<run_id>/step_NNNNNNN/`. A run only ever writes, prunes and
resumes (`--resume-from latest`) inside its own folder, so a fresh start (a new run id in
the same run dir) can neither delete nor load the previous run's checkpoints. Checkpoints
written flat into `checkpoints/` by earlier versions still count, as the run their
`trainer_state.json` names. `export/` holds the newest export; a run about to replace
another run's export first moves it to `checkpoints/<that run>/export/`.

Standard library only (the control plane reads this without importing torch)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_train.checkpoint import store as checkpoints
from dflash_train.config.train_config import RUN_ID_PATTERN

if TYPE_CHECKING:
    from dflash_train.config import TrainConfig

# A run id becomes a directory name: one plain path component, nothing to escape with.
RUN_ID = RUN_ID_PATTERN
EXPORT_INFO = "dflash_export.json"
EXPORT_CONFIG = "config.json"  # an export's HF-style config, and its weights
EXPORT_WEIGHTS = "model.safetensors"
DRAFTER_CONFIG = "drafter_config.json"  # drafter.CONFIG_FILE, named here without torch
# The fields a resumed checkpoint must agree on with the run that loads it, in the order
# they are checked, with the train option that sets each.
COMPATIBLE_FIELDS = {
    "target_model": "--target-model",
    "hidden_size": "--target-model",
    "num_target_layers": "--target-model",
    "target_layers": "--target-layers",
    "block_size": "--block-size",
    "draft_layers": "--draft-layers",
}


class IncompatibleCheckpoint(ValueError):
    """A checkpoint recorded with another shape than the run that would load it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise ValueError(
            f"run_id: {run_id!r} is not 1-64 letters, digits, '_', '-' or '.' "
            "starting with a letter or digit (it names the run's checkpoint folder)"
        )
    return run_id


def run_folder(root: Path, run_id: str) -> Path:
    """Where run `run_id` writes its checkpoints (`root` is RUN_DIR/checkpoints)."""
    return root / check_run_id(run_id)


def run_checkpoints(root: Path, run_id: str) -> list[tuple[int, Path]]:
    """Run `run_id`'s complete checkpoints, oldest written first: its own folder, plus
    checkpoints of the flat layout of earlier versions that record this run id."""
    found = checkpoints.list_checkpoints(root / run_id) if RUN_ID.fullmatch(run_id) else []
    legacy = [
        (s, p)
        for s, p in checkpoints.list_checkpoints(root)
        if checkpoints.recorded_run(p) == run_id
    ]
    return sorted(legacy + found, key=lambda item: checkpoints.write_order(item[1]))


def newest_of_run(root: Path, run_id: str) -> Path | None:
    found = run_checkpoints(root, run_id)
    return found[-1][1] if found else None


def runs_with_checkpoints(root: Path) -> list[str]:
    """Run ids that have at least one complete checkpoint under `root`, oldest run first."""
    runs: dict[str, float] = {}
    candidates = [p for p in _children(root) if p.is_dir() and RUN_ID.fullmatch(p.name)]
    for folder in candidates:
        found = checkpoints.list_checkpoints(folder)
        if found and not checkpoints.is_step_dir(folder):
            runs[folder.name] = checkpoints.write_order(found[-1][1])[0]
    for _, path in checkpoints.list_checkpoints(root):  # the flat layout of earlier versions
        run = checkpoints.recorded_run(path)
        if run is not None:
            runs[run] = max(runs.get(run, 0.0), checkpoints.write_order(path)[0])
    return sorted(runs, key=lambda run: runs[run])


def _children(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def resolve_resume(spec: str, root: Path, run_id: str) -> Path | None:
    """`latest`: run `run_id`'s newest checkpoint (None when it has none yet; another run's
    are never considered). A path: that checkpoint, whichever run wrote it (the caller
    reports `resumed_run`). Raises ValueError with a one-line reason."""
    if spec == "latest":
        return newest_of_run(root, run_id)
    return checkpoints.resolve_resume(spec, root)


def nothing_to_train(path: Path, max_steps: int | None) -> str | None:
    """Why resuming checkpoint `path` under `max_steps` would train nothing (None: it has
    steps left, or no --max-steps caps it). Read from its trainer_state.json alone, so the
    trainer refuses at once, before any model loads, and a launch or restart before anything
    starts or stops: a run resumed at its schedule's end loaded the target and drafter only
    to end `completed` with no checkpoint or export of its own."""
    if max_steps is None:
        return None
    try:
        step = checkpoints.read_state(path).step
    except (OSError, ValueError, TypeError):
        return None  # an unreadable state is the resume's own error, reported where it loads
    if not isinstance(step, int) or step < max_steps:
        return None
    where = "at" if step == max_steps else "past"
    return (
        f"resume_from: checkpoint {path} is at step {step}, already {where} --max-steps "
        f"{max_steps}: nothing to train (raise --max-steps to train on, or export it: "
        f"dflash-train export {path} --out DIR)"
    )


def resume_refusal(config: TrainConfig, root: Path) -> str | None:
    """nothing_to_train for the checkpoint `--resume-from` names in a run whose checkpoints
    are under `root` (RUN_DIR/checkpoints); a resume point that does not resolve is left to
    the trainer's own report of it, and `latest` without a run id is a fresh run's, which
    has no checkpoint."""
    spec, run_id = config.run.resume_from, config.run.run_id
    if spec is None or config.optimiser.max_steps is None or (spec == "latest" and not run_id):
        return None
    try:
        path = resolve_resume(spec, root, run_id or "")
    except ValueError:
        return None
    return None if path is None else nothing_to_train(path, config.optimiser.max_steps)


# -- compatibility ------------------------------------------------------------------------


def checkpoint_facts(path: Path) -> dict[str, Any]:
    """The shape a checkpoint was trained with (the COMPATIBLE_FIELDS it records)."""
    config, state = _json_object(path / DRAFTER_CONFIG), _json_object(path / checkpoints.STATE_FILE)
    layers = config.get("target_layer_ids")
    return {
        "target_model": state.get("target"),
        "hidden_size": config.get("hidden_size"),
        "num_target_layers": config.get("num_target_layers"),
        "target_layers": list(layers) if isinstance(layers, list) else None,
        "block_size": config.get("block_size"),
        "draft_layers": config.get("num_layers"),
        "run_id": state.get("run_id"),
        "step": state.get("step"),
    }


def weights_kind(path: Path) -> str | None:
    """ "export" for an export dir, "checkpoint" for a checkpoint dir, else None."""
    if (path / EXPORT_CONFIG).is_file() and (path / EXPORT_WEIGHTS).is_file():
        return "export"
    if (path / DRAFTER_CONFIG).is_file() and (path / checkpoints.STATE_FILE).is_file():
        return "checkpoint"
    return None


def export_facts(path: Path) -> dict[str, Any]:
    """The shape an export was trained with, as checkpoint_facts names it (an export does
    not record its target model, so that field is not judged), and the run and step it came
    from."""
    config, info = _json_object(path / EXPORT_CONFIG), _json_object(path / EXPORT_INFO)
    dflash = config.get("dflash_config")
    dflash = dflash if isinstance(dflash, dict) else {}
    layers = dflash.get("target_layer_ids")
    step = Path(str(info.get("checkpoint", ""))).name.removeprefix("step_")
    return {
        "target_model": None,
        "hidden_size": config.get("hidden_size"),
        "num_target_layers": config.get("num_target_layers"),
        "target_layers": list(layers) if isinstance(layers, list) else None,
        "block_size": dflash.get("block_size", config.get("block_size")),
        "draft_layers": config.get("num_hidden_layers"),
        "run_id": info.get("run_id"),
        "step": int(step) if step.isdigit() else None,
    }


@dataclass(frozen=True)
class InitSource:
    """The weights `train --init-from` names (training/init_weights.py loads them)."""

    path: Path
    kind: str  # "export" or "checkpoint" (weights_kind)
    facts: dict[str, Any]  # the shape facts, and the run and step it came from


def find_init_source(spec: str, config: TrainConfig) -> InitSource:
    """The weights `--init-from` names, checked against the run's config without torch (the
    trainer before anything heavy loads, and launch's preflight): ValueError naming the
    field, or that the path is neither kind."""
    path = Path(spec).expanduser()
    kind = weights_kind(path)
    if kind is None:
        raise ValueError(
            f"init_from: {path} is neither an export dir (config.json and model.safetensors) "
            "nor a checkpoint dir (drafter_config.json and state.json)"
        )
    facts = export_facts(path) if kind == "export" else checkpoint_facts(path)
    check_compatible(f"--init-from {path}", facts, facts_from_config(config), to="start from it")
    return InitSource(path.resolve(), kind, facts)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def target_identity(spec: str) -> str:
    """One name per target model: `smollm2`, `random:<preset>`, or the model dir's path."""
    from dflash_train.targets.frozen_target import resolve_target

    try:
        resolved = resolve_target(spec)
    except ValueError:
        return spec.strip()
    return str(resolved.path) if resolved.kind == "hf" else resolved.spec.strip()


def facts_from_config(config: TrainConfig) -> dict[str, Any]:
    """The same facts for a run about to start with this config (torch-free: the
    target's shape comes from its config, not from loading it)."""
    from dflash_train.targets.frozen_target import (
        context_layer_count,
        resolve_target,
        target_layer_ids,
    )

    facts: dict[str, Any] = {
        "target_model": target_identity(config.train.target_model),
        "block_size": config.model.block_size,
        "draft_layers": config.model.draft_layers,
    }
    try:
        resolved = resolve_target(config.train.target_model)
    except ValueError:
        return facts
    k = context_layer_count(resolved.num_layers, config.model.target_layers)
    try:
        ids = target_layer_ids(resolved.num_layers, k)
    except ValueError:
        ids = None
    facts |= {
        "hidden_size": resolved.hidden_size,
        "num_target_layers": resolved.num_layers,
        "target_layers": ids,
    }
    return facts


def check_compatible(
    what: str, saved: Mapping[str, Any], wanted: Mapping[str, Any], to: str = "resume"
) -> None:
    """Raise IncompatibleCheckpoint naming the first field where `what` (a checkpoint or an
    export, with facts `saved`) and the run that would load it (`wanted`) differ; a field
    either side does not know is not judged. `to` says what keeping the value allows."""
    for field, option in COMPATIBLE_FIELDS.items():
        have, want = saved.get(field), wanted.get(field)
        if have is None or want is None or have == want:
            continue
        raise IncompatibleCheckpoint(
            field,
            f"{field}: {what} was trained with {field} {have}, this run has "
            f"{want} ({option}); keep the value to {to}, or start fresh",
        )


# -- where a run's things are -------------------------------------------------------------


def export_owner(export_dir: Path) -> str | None:
    try:
        info = json.loads((export_dir / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    run = info.get("run_id") if isinstance(info, dict) else None
    return run if isinstance(run, str) else None


def set_aside_export(
    run_dir_root: Path, new_run: str, owner_hint: str | None = None
) -> Path | None:
    """Before run `new_run` can write `export/`: move an export there of another run into
    that run's checkpoint folder (`owner_hint`: the run it must be when it does not say, as
    exports of earlier versions do not). One rename, nothing copied or deleted but an older
    export of that same run. Returns where it went."""
    export = run_dir_root / "export"
    if not export.is_dir():
        return None
    owner = export_owner(export) or owner_hint
    if owner == new_run:
        return None
    if owner is not None and RUN_ID.fullmatch(owner):
        aside = run_dir_root / "checkpoints" / owner / "export"
    else:
        aside = run_dir_root / f"export.before-{check_run_id(new_run)}"
    if aside.exists():
        shutil.rmtree(aside)
    aside.parent.mkdir(parents=True, exist_ok=True)
    os.rename(export, aside)
    return aside


def export_of_run(run_dir_root: Path, run_id: str) -> Path | None:
    """Where run `run_id`'s export is: `export/` while it is the newest, else the copy
    moved into its checkpoint folder."""
    current = run_dir_root / "export"
    if export_owner(current) == run_id:
        return current
    aside = run_dir_root / "checkpoints" / run_id / "export"
    return aside if RUN_ID.fullmatch(run_id) and aside.is_dir() else None


def run_summary(run_dir_root: Path, run_id: str) -> dict[str, Any]:
    root = run_dir_root / "checkpoints"
    found = run_checkpoints(root, run_id)
    export = export_of_run(run_dir_root, run_id)
    return {
        "run_id": run_id,
        "dir": str(root / run_id),
        "newest": str(found[-1][1]) if found else None,
        "steps": [step for step, _ in found],
        "export": str(export) if export else None,
    }


def run_layout(run_dir_root: Path, run_id: str | None) -> dict[str, Any]:
    """For run.json and `status`: this run's checkpoint folder and newest checkpoint, and
    every other run's whose checkpoints share the run dir (with where its export went)."""
    others = [r for r in runs_with_checkpoints(run_dir_root / "checkpoints") if r != run_id]
    export = run_dir_root / "export"
    return {
        "checkpoints": run_summary(run_dir_root, run_id) if run_id else None,
        "previous_runs": [run_summary(run_dir_root, r) for r in others],
        # The newest export and the run it came from (None: written by an older version).
        "newest_export": {"path": str(export), "run_id": export_owner(export)}
        if export.is_dir()
        else None,
    }
