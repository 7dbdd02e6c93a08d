"""What a smoke run's status stream says, for the quality session's smoke stages: its step
lines, the seconds a step took (the span from the first step line after `after` to the
last, over the steps between them; None with fewer than two), and how it ended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _lines(run_dir: str | Path) -> list[dict[str, Any]]:
    stream = Path(run_dir) / "status.jsonl"
    return [json.loads(line) for line in stream.open() if line.strip()]


def step_lines(run_dir: str | Path) -> list[dict[str, Any]]:
    return [line for line in _lines(run_dir) if line.get("kind") == "step"]


def run_ends(run_dir: str | Path) -> list[str | None]:
    return [line.get("reason") for line in _lines(run_dir) if line.get("kind") == "run_end"]


def step_seconds(run_dir: str | Path, after: int = 20) -> float | None:
    steps = [s for s in step_lines(run_dir) if s["step"] > after]
    if len(steps) < 2:
        return None
    return round((steps[-1]["t"] - steps[0]["t"]) / (steps[-1]["step"] - steps[0]["step"]), 4)
