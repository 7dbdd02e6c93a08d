"""The step loop shared by both pipelines: draw (batch, hidden states) pairs from the
source, step the drafter, hand interval snapshots to the monitor, checkpoint on schedule,
and stop cleanly between steps."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dflash_train.pipeline.distributed import shard_positions
from dflash_train.pipeline.monitor import StepRecord
from dflash_train.pipeline.sources import EpochPlan
from dflash_train.pipeline.target_workers import HiddenBatch
from dflash_train.training.stop_flag import ORPHANED

if TYPE_CHECKING:
    from dflash_train.training.run import TrainingRun


@dataclass
class Progress:
    """Where the run is: what the loop advances step by step and a checkpoint records."""

    step: int = 0
    epoch: int = 0
    tokens_seen: int = 0
    # This epoch's batches done, by position in the epoch's plan (a resume skips them).
    consumed: set[int] = field(default_factory=set)
    # How many of `consumed` came from the checkpoint: every rank's, where the rest are
    # this rank's own (each rank trained as many as this one since).
    resumed: int = 0

    def epoch_done(self, world_size: int, batches: int) -> float:
        """The share of this epoch's batches trained, on every rank."""
        own = len(self.consumed) - self.resumed
        return min(1.0, (self.resumed + own * world_size) / max(1, batches))


def run_epochs(run: TrainingRun) -> str:
    """Returns the run_end reason: completed, signal or error; or orphaned (the run dir is
    gone: no run_end is written)."""
    epochs = run.config.optimiser.epochs
    assert run.source is not None and run.monitor is not None
    # Resumed with --epochs already reached (a checkpoint of the last epoch's end, or fewer
    # --epochs than it trained): nothing left. A checkpoint at or past --max-steps never gets
    # here: `train` refuses it before any model loads (checkpoint/layout.py nothing_to_train).
    if run.progress.step >= run.total_steps:
        return _finish(run, "completed")
    for epoch in range(run.progress.epoch, epochs):
        if run.progress.epoch != epoch:
            run.progress.epoch, run.progress.consumed, run.progress.resumed = epoch, set(), 0
        order = run.plan(epoch)
        remaining = [p for p in range(len(order)) if p not in run.progress.consumed]
        positions = shard_positions(remaining, run.rank.rank, run.rank.world_size)
        plan = EpochPlan(epoch, order, positions)
        run.monitor.touch()
        reason = None
        # With several ranks a stop is acted on only through `agree`, at the same step
        # everywhere, so the source must not end early on one rank.
        source_stop = run.stop.is_set if run.group is None else (lambda: False)
        batches = run.source.batches(plan, source_stop)
        with contextlib.closing(batches):
            reason = _train_epoch(run, epoch, len(order), batches)
        if reason is None and run.progress.step < run.total_steps and run.group is None:
            reason = _stop_reason(run)  # a stop that arrived while the source was waiting
        if reason is not None:
            return _finish(run, reason)
        if run.progress.step >= run.total_steps:
            break
        run.monitor.emit(
            "event",
            level="info",
            code="epoch_end",
            message=f"epoch {epoch + 1}/{epochs} done at step {run.progress.step}",
            epoch=epoch,
            step=run.progress.step,
        )
        run.progress.epoch, run.progress.consumed, run.progress.resumed = epoch + 1, set(), 0
        run.save()
        run.heldout.after_save(run.progress.step)
    return _finish(run, "completed")


def _train_epoch(
    run: TrainingRun, epoch: int, batches_in_epoch: int, batches: Iterator[HiddenBatch]
) -> str | None:
    log_every, save_every = run.config.run.log_every, run.config.run.save_every
    interval_tokens = interval_steps = 0
    for batch in batches:
        batch.wait_ready(run.device)
        run.stepper.step(batch, epoch)
        run.progress.step += 1
        run.progress.consumed.add(batch.position)
        run.progress.tokens_seen += batch.tokens
        interval_tokens += batch.tokens
        interval_steps += 1
        reason = _stop_reason(run)
        if interval_steps >= log_every or reason is not None:
            _submit(run, epoch, batches_in_epoch, interval_tokens)
            interval_tokens = interval_steps = 0
        if (save_every and run.progress.step % save_every == 0) or run.heldout.wants_save(
            run.progress.step
        ):
            run.save()
            run.heldout.after_save(run.progress.step)
        if reason is not None:
            return reason
    if interval_steps:
        _submit(run, epoch, batches_in_epoch, interval_tokens)
    return None


def _stop_reason(run: TrainingRun) -> str | None:
    """completed (max steps), signal or error; every rank agrees before anyone acts."""
    done = run.progress.step >= run.total_steps
    stopping = run.stop.is_set()
    error = stopping and run.stop.reason == "error"
    if run.group is not None:
        done, stopping, error = run.group.agree(done, stopping, error)
        if stopping and not run.stop.is_set():
            run.stop.request("error" if error else "signal", "stopped by another rank")
    if error:
        return "error"
    if stopping and run.stop.reason == ORPHANED:
        return ORPHANED
    if stopping:
        return "signal"
    return "completed" if done else None


def _submit(run: TrainingRun, epoch: int, batches: int, tokens: int) -> None:
    assert run.monitor is not None
    run.monitor.submit_step(
        StepRecord(
            step=run.progress.step,
            epoch=epoch,
            # Ranks share the epoch evenly; rank 0 knows only its own share.
            epoch_progress=run.progress.epoch_done(run.rank.world_size, batches),
            lr=run.stepper.lr,
            tokens_total=run.progress.tokens_seen,
            tokens_interval=tokens,
            at=time.monotonic(),
            metrics=run.stepper.snapshot(),
        )
    )


def _finish(run: TrainingRun, reason: str) -> str:
    """Checkpoint (not after an error: the last good one stays the newest) and export."""
    if reason in ("error", ORPHANED):
        # After an error the last good checkpoint stays the newest; an orphan's would
        # recreate the deleted run dir.
        print(f"stopping: {run.stop.message}", file=sys.stderr)
        return reason
    run.save()
    if reason == "completed":
        run.heldout.after_save(run.progress.step)  # the final checkpoint's score, before export
    if reason == "completed" and run.rank.is_main:
        _export(run)
    return reason


def _export(run: TrainingRun) -> None:
    """A failed export leaves the checkpoints and is reported; it does not fail the run."""
    from dflash_train.checkpoint.layout import newest_of_run

    assert run.monitor is not None
    run.wait_for_checkpoint()  # the newest checkpoint is on disk before it is exported
    source = newest_of_run(run.run_dir.checkpoints, run.run_id)
    if source is None:
        return
    start = time.monotonic()
    try:
        from dflash_train.checkpoint.export import export_checkpoint, servable
        from dflash_train.model.drafter import read_drafter_config

        export_checkpoint(source, run.run_dir.export)
        problem = servable(read_drafter_config(source))
    except Exception as exc:
        run.monitor.emit(
            "event",
            level="warning",
            code="export_failed",
            message=f"export to {run.run_dir.export} failed: {type(exc).__name__}: {exc}",
        )
        return
    run.monitor.emit(
        "event",
        level="info",
        code="exported",
        message=f"drafter exported to {run.run_dir.export}" + (f"; {problem}" if problem else ""),
        servable=problem is None,
        path=str(run.run_dir.export),
        seconds=round(time.monotonic() - start, 3),
    )
