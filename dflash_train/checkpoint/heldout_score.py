"""A checkpoint's held-out score: `eval.json` in its step folder, the fields of the `eval`
event that measured it (protocol.EVENT_CODE_FIELDS). `status`, `export --best` and pruning
read it; the in-run evaluation and `dflash-train eval --run-dir` write it. Kept beside the
weights, so the score travels with the checkpoint and outlives a rotated stream.

Standard library only (the control plane reads it without importing torch)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.rundir import atomic_write_json

SCORE_FILE = "eval.json"


def read_score(checkpoint: Path) -> dict[str, Any] | None:
    """The checkpoint's recorded evaluation, None when it has none (or an unreadable one)."""
    try:
        data = json.loads((checkpoint / SCORE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if _finite(data.get("tau")):
        return data
    if data.get("tau") is None and _finite(data.get("tau_tf")):
        return data  # a hybrid target's: teacher-forced only
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def score_value(score: Mapping[str, Any]) -> float:
    """What ranks a read score (protocol.eval_score; read_score kept only scored ones).
    One run's checkpoints are all of one kind."""
    value = protocol.eval_score(score)
    assert value is not None
    return value


def write_score(checkpoint: Path, fields: Mapping[str, Any]) -> None:
    # The checkpoint exists; one deleted meanwhile (or its run dir) is not recreated.
    atomic_write_json(checkpoint / SCORE_FILE, dict(fields), make_parent=False)


def best_of(checkpoints: Iterable[Path]) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint with the highest held-out tau; on a tie, the higher teacher-forced
    tau, then the later step (it trained longer for the same score). None when none has a
    score."""
    best: tuple[tuple[float, float, str], Path, dict[str, Any]] | None = None
    for path in checkpoints:
        score = read_score(path)
        if score is None:
            continue
        tf = score.get("tau_tf")
        tf = float(tf) if _finite(tf) else 0.0
        key = (score_value(score), tf, path.name)
        if best is None or key > best[0]:
            best = (key, path, score)
    return None if best is None else (best[1], best[2])
