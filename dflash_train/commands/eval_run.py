"""`dflash-train eval --run-dir RUN`: an evaluation by hand of one of the run's
checkpoints, with the run's own settings (target, held-out set, --eval-prompts,
--eval-tokens) unless the command line says otherwise, recorded as the run records its
own (control/eval_record.py): the checkpoint's eval.json and an `eval` event."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_train.rundir import RunDir

if TYPE_CHECKING:
    from dflash_train.data.heldout import HeldoutSet
    from dflash_train.decode.evaluation import EvalSummary
    from dflash_train.model.drafter import DFlashDrafter
    from dflash_train.targets.frozen_target import Target


@dataclass
class RunEvalError(ValueError):
    code: str
    message: str

    def __str__(self) -> str:
        return self.message


def apply_run_defaults(args: argparse.Namespace) -> HeldoutSet:
    """Fill what the command line left out from the run's newest run_start; returns the
    held-out set to decode from (--prompts, else the run's). Raises RunEvalError."""
    from dflash_train.control.run_status import newest_run_start
    from dflash_train.data.heldout import HeldoutError, load_heldout
    from dflash_train.training.heldout_eval import eval_data_spec

    run_dir = RunDir.at(args.run_dir)
    if not run_dir.root.is_dir():
        raise RunEvalError("run_dir_missing", f"run_dir: {run_dir.root} is not a directory")
    start = newest_run_start(run_dir)
    if start is None:
        raise RunEvalError("bad_argument", f"run_dir: {run_dir.status} holds no run_start")
    config = start["config"]
    args.target_model = args.target_model or config.get("target_model")
    args.drafter = args.drafter or str(run_dir.root)
    if args.max_prompts is None:
        args.max_prompts = config.get("eval_prompts") or 16
    if args.max_new_tokens is None:
        args.max_new_tokens = config.get("eval_tokens") or 128
    args.max_length = config.get("max_length") or 2048
    # data_dir is a list when the run trained on several (train's repeated --data-dir).
    data_dirs = config.get("data_dir") or ""
    spec = args.prompts or eval_data_spec(data_dirs, config.get("eval_data"))
    args.prompts = spec
    try:
        return load_heldout(spec)
    except HeldoutError as exc:
        raise RunEvalError("bad_prompts", str(exc)) from None


def checkpoint_step(drafter_path: str) -> tuple[Path, int]:
    """The checkpoint --drafter names (a run dir: its newest) and its step."""
    from dflash_train.checkpoint.export import resolve_export_source
    from dflash_train.checkpoint.store import STATE_FILE
    from dflash_train.rundir import read_json

    checkpoint = resolve_export_source(drafter_path)
    state = read_json(checkpoint / STATE_FILE)
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int):
        raise ValueError(f"drafter: {checkpoint} records no step ({STATE_FILE})")
    return checkpoint, step


def record_manual_eval(
    args: argparse.Namespace,
    target: Target,
    drafter: DFlashDrafter,
    heldout: HeldoutSet,
    summary: EvalSummary,
    started: float,
) -> dict[str, Any]:
    """The teacher-forced figures, then the record: eval.json and the event. Returns the
    reply's extra fields."""
    from dflash_train.checkpoint.heldout_score import write_score
    from dflash_train.control.eval_record import record_event
    from dflash_train.decode.heldout_figures import event_fields, teacher_forced

    checkpoint, step = checkpoint_step(args.drafter)
    slot_acc, tau_tf = teacher_forced(target, drafter, heldout.rows, args.max_length)
    fields = event_fields(summary, slot_acc, tau_tf, args.max_new_tokens)
    fields |= {
        "dtype": str(target.embed_tokens.weight.dtype).removeprefix("torch."),
        "device": str(target.device),
        "step": step,
        "seconds": round(time.monotonic() - started, 3),
        "source": "manual",
        "checkpoint": str(checkpoint),
    }
    write_score(checkpoint, fields)
    where = record_event(RunDir.at(args.run_dir), fields)
    return {
        "step": step,
        "tau_tf": fields["tau_tf"],
        "slot_acc": fields["slot_acc"],
        "checkpoint": str(checkpoint),
        "recorded": where,
    }
