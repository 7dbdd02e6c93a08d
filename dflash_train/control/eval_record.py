"""Where an evaluation by hand (`dflash-train eval --run-dir RUN`) leaves its result: the
checkpoint's score (eval.json) and an `eval` event in the run's stream, so `status`,
`export --best` and the console see it as they see the run's own.

The stream has one writer while a trainer lives (its seq numbers are the readers'
cursors), so a live run is handed the event through `RUN_DIR/eval_inbox/`, which its
monitor thread writes into the stream within a second or two. A run that is not live has
its stream appended to directly, under the run lock held for that moment, with seq
continuing after the stream's last line. Standard library only."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from dflash_train import protocol
from dflash_train.rundir import LockHeld, RunDir, atomic_write_json
from dflash_train.stream.append import append_line
from dflash_train.stream.eval_inbox import inbox_dir


def _differ(fields: Mapping[str, Any]) -> str:
    """How many outputs differ, where the event says (an older trainer's does not)."""
    mismatched = fields.get("mismatched")
    return f" ({mismatched} of {fields['prompts']} differ)" if isinstance(mismatched, int) else ""


def event_line_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The `event` line's fields for an evaluation's figures (level, code, message added)."""
    tau_tf = fields.get("tau_tf")
    if fields["tau"] is None:  # a hybrid target: scored teacher-forced only
        message = (
            f"held-out tau {tau_tf:.3f} teacher-forced at step {fields['step']} (a hybrid "
            f"target is not decoded speculatively), {fields['seconds']:.1f} s"
        )
        return {"level": "info", "code": "eval", "message": message, **fields}
    message = (
        f"held-out tau {fields['tau']:.3f} at step {fields['step']}"
        + ("" if tau_tf is None else f" (teacher-forced {tau_tf:.3f})")
        + ("" if fields["lossless"] else f"; NOT lossless{_differ(fields)}")
        + f", {fields['prompts']} prompts, {fields['seconds']:.1f} s"
        + (" (by hand)" if fields.get("source") == "manual" else "")
    )
    return {"level": "info", "code": "eval", "message": message, **fields}


def record_event(run_dir: RunDir, fields: Mapping[str, Any]) -> str:
    """Put the event where the run's readers see it; returns "stream" (appended now) or
    "inbox" (a live trainer writes it). Raises ValueError when the run has no stream."""
    line = event_line_fields(fields)
    protocol.encode_line("event", seq=0, run="check", **line)  # a bad record fails here
    try:
        if not append_line(run_dir, "event", line):
            raise ValueError(f"run_dir: {run_dir.status} holds no line to append to")
        return "stream"
    except LockHeld:
        folder = inbox_dir(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / f"{time.time_ns()}-{os.getpid()}.json", line)
        return "inbox"
