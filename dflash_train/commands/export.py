"""`dflash-train export RUN_DIR|CKPT --out DIR`: write the drafter in the z-lab DFlash
layout; prints one JSON reply."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dflash_train import protocol


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", metavar="RUN_DIR|CKPT", help="a run dir (its newest checkpoint) or a checkpoint"
    )
    parser.add_argument(
        "--out", default=None, help="output directory (default: RUN_DIR/export for a run dir)"
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help="of a run dir, the checkpoint with the highest held-out tau (its eval.json), "
        "not the newest",
    )
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16", "float32"),
        help="weight dtype of the export (default: bfloat16, what engines serve)",
    )


def _reply(reply: protocol.Reply) -> None:
    from dflash_train.commands.launch import print_reply

    print_reply(reply)


def run(args: argparse.Namespace) -> int:
    from dflash_train.checkpoint.export import export_checkpoint, resolve_export_source, servable
    from dflash_train.model.drafter import read_drafter_config

    start = time.monotonic()
    chosen: dict[str, object] = {}
    try:
        if args.best:
            checkpoint, chosen = best_checkpoint(Path(args.source).expanduser().absolute())
        else:
            checkpoint = resolve_export_source(args.source)
    except ValueError as exc:
        _reply(protocol.reply_error("export", "bad_source", str(exc)))
        return 2
    if args.out is not None:
        out = Path(args.out).expanduser().absolute()
    elif checkpoint != Path(args.source).expanduser().absolute():
        out = Path(args.source).expanduser().absolute() / "export"
    else:
        _reply(protocol.reply_error("export", "bad_argument", "out: required for a checkpoint"))
        return 2
    if out == checkpoint or checkpoint in out.parents:
        _reply(protocol.reply_error("export", "bad_argument", f"out: {out} is inside {checkpoint}"))
        return 2
    try:
        path = export_checkpoint(checkpoint, out, args.dtype)
        problem = servable(read_drafter_config(checkpoint))
    except (ValueError, OSError, RuntimeError) as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        _reply(protocol.reply_error("export", "export_failed", message))
        return 1
    seconds = round(time.monotonic() - start, 3)
    # Said in the reply's own line: an export no engine can load must not pass unnoticed.
    told = f"exported {checkpoint.name} to {path} in {seconds:.1f} s"
    if chosen:
        told = f"{told} (best held-out {_score_words(chosen)} at step {chosen['step']})"
    _reply(
        protocol.reply_ok(
            "export",
            path=str(path),
            checkpoint=str(checkpoint),
            dtype=args.dtype,
            files=sorted(p.name for p in path.iterdir()),
            seconds=seconds,
            servable=problem is None,
            **chosen,
            message=f"{told}; {problem}" if problem else f"{told}; servable by DFlash engines",
        )
    )
    return 0


def best_checkpoint(run_dir: Path) -> tuple[Path, dict[str, object]]:
    """The run's complete checkpoint with the highest held-out tau, and its step and tau
    (plus tau_tf) for the reply. Raises ValueError naming what is missing."""
    from dflash_train.checkpoint.heldout_score import best_of
    from dflash_train.checkpoint.layout import run_checkpoints
    from dflash_train.rundir import RunDir, read_json
    from dflash_train.stream.reader import last_record

    where = RunDir.at(run_dir)
    if not (where.checkpoints).is_dir():
        raise ValueError(f"source: --best needs a run dir; {run_dir} has no checkpoints/")
    last = last_record(where.status)
    record = read_json(where.run_json)
    run_id = last.run if last is not None else (record or {}).get("run_id")
    if not isinstance(run_id, str):
        raise ValueError(f"source: {run_dir} names no run (no status.jsonl or run.json)")
    best = best_of(path for _, path in run_checkpoints(where.checkpoints, run_id))
    if best is None:
        raise ValueError(
            f"source: no checkpoint of run {run_id} has a held-out score (eval.json); "
            f"train with --eval-every or run dflash-train eval --run-dir {run_dir}"
        )
    path, score = best
    return path, {"step": score.get("step"), "tau": score.get("tau"), "tau_tf": score.get("tau_tf")}


def _score_words(chosen: dict[str, object]) -> str:
    if chosen.get("tau") is None:  # a hybrid target's score: teacher-forced only
        return f"tau {chosen['tau_tf']} teacher-forced"
    return f"tau {chosen['tau']}"
