"""Resuming a training run: which checkpoint (`latest` is this run id's newest; a path may
be another run's), checked against the run's config before anything heavy loads and again
against the loaded target's real shape, then the drafter, optimizer, schedule, RNG and
position restored; the steps the run has left are planned from that position at this run's
rank count."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.checkpoint import store as checkpoints
from dflash_train.pipeline.distributed import shard_positions
from dflash_train.training.loop import Progress

if TYPE_CHECKING:
    from dflash_train.model.drafter import DFlashConfig
    from dflash_train.training.run import TrainingRun


def find_resume(run: TrainingRun, spec: str) -> Path | None:
    path = checkpoint_layout.resolve_resume(spec, run.run_dir.checkpoints, run.run_id)
    if path is None:
        # A restart of a run that died before its first save starts over instead of failing.
        print(
            f"--resume-from latest: run {run.run_id} has no checkpoint yet; starting at step 0",
            file=sys.stderr,
        )
        return None
    wanted = checkpoint_layout.facts_from_config(run.config)
    checkpoint_layout.check_compatible(
        f"checkpoint {path}", checkpoint_layout.checkpoint_facts(path), wanted
    )
    return path


def check_resumed_shape(run: TrainingRun, config: DFlashConfig) -> None:
    """The full check, against the loaded target's real shape."""
    assert run.resume_path is not None
    wanted = {
        "target_model": run.target_identity,
        "hidden_size": config.hidden_size,
        "num_target_layers": config.num_target_layers,
        "target_layers": list(config.target_layer_ids),
        "block_size": config.block_size,
        "draft_layers": config.num_layers,
    }
    path = run.resume_path
    checkpoint_layout.check_compatible(
        f"checkpoint {path}", checkpoint_layout.checkpoint_facts(path), wanted
    )


def planned_steps(
    plan: Callable[[int], Sequence[Sequence[int]]],
    epochs: int,
    world_size: int,
    start: checkpoints.TrainState | None = None,
    limit: int | None = None,
) -> int:
    """The step the run ends at: each step takes one batch per drafter rank (every rank the
    same count, shard_positions). Batch counts differ a little between epochs (buckets are
    cut afresh each time). From a checkpoint it is the checkpoint's step plus the steps its
    untrained batches take at this run's rank count, which can differ from the count that
    saved it (a restart with another targets:drafters split): counting the whole run at the
    new count instead would end a run that gained ranks before its data was trained on, and
    run one that lost ranks past its learning-rate schedule's end.

    `limit` (--max-steps) caps the count, and the epochs past it are never planned: a run
    told `--epochs 1000 --max-steps 1700` would otherwise cut a thousand epochs' batches
    before its first step (20 ms each for 76,560 samples, and minutes for a small
    tokens-per-batch)."""

    def steps_of(positions: Sequence[int]) -> int:
        return len(shard_positions(positions, 0, world_size))

    if start is None:
        total, first = 0, 0
    elif start.epoch >= epochs:  # nothing left to plan
        total, first = start.step, epochs
    else:
        done = set(start.consumed)
        total = start.step + steps_of([p for p in range(len(plan(start.epoch))) if p not in done])
        first = start.epoch + 1
    for epoch in range(first, epochs):
        if limit is not None and total >= limit:
            break
        total += steps_of(range(len(plan(epoch))))
    return total if limit is None else min(total, limit)


def resume(run: TrainingRun, path: Path) -> None:
    from dflash_train.model.drafter import load_drafter

    loaded = checkpoints.load_checkpoint(path)
    saved = load_drafter(path, run.device)
    run.drafter.load_state_dict(saved.state_dict())
    run.stepper.load_state_dicts(loaded.optimizer, loaded.scheduler)
    checkpoints.restore_rng(loaded.rng)
    state = loaded.state
    consumed = set(state.consumed)
    run.progress = Progress(state.step, state.epoch, state.tokens_seen, consumed, len(consumed))
    run.last_saved_step = state.step
    # Values given in the config win over the settings live at the checkpoint.
    pipeline = run.config.pipeline
    given = {"hs_queue_depth": pipeline.hs_queue_depth, "hs_min_ready": pipeline.hs_min_ready}
    restored = {k: v for k, v in state.settings.items() if given.get(k) is None}
    run.settings = {**run.settings, **restored}
    if run.settings["hs_min_ready"] > run.settings["hs_queue_depth"]:
        run.settings["hs_min_ready"] = run.settings["hs_queue_depth"]
    run.resumed_from = str(path)
    run.resumed_run = state.run_id
    other = "" if run.resumed_run == run.run_id else f" (run {run.resumed_run})"
    print(f"resumed from {path}{other} at step {run.progress.step}", file=sys.stderr)
