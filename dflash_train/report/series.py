"""A run's figures for the report, read from its status stream alone: the step metrics, GPU
utilisation, held-out evaluations, checkpoints, (re)starts and alerts, with the run's
config, topology and dataset from its first run_start. One pass over the file; a line
that does not decode is counted and skipped, as every reader of the stream does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dflash_train import protocol
from dflash_train.stream.reader import line_time

STEP_FIELDS = ("loss", "acc", "tau", "ktok_s")
# Event codes that are markers of the reader (tail's), not of the run.
_NOT_ALERTS = protocol.MARKER_CODES


@dataclass(frozen=True)
class Mark:
    """Something that happened at a step: a checkpoint, a (re)start or an alert."""

    step: float
    t: float
    label: str
    level: str = "info"


@dataclass
class RunSeries:
    path: Path
    run_ids: list[str] = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)  # the first run_start's fields
    newest_start: dict[str, Any] = field(default_factory=dict)  # the last run_start's
    end: dict[str, Any] | None = None  # the last run_end's fields
    first_t: float | None = None
    last_t: float | None = None
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    metrics: dict[str, np.ndarray] = field(default_factory=dict)
    gpu_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gpu_util: dict[int, np.ndarray] = field(default_factory=dict)  # index -> util per gpu_t
    gpu_roles: dict[int, str] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[Mark] = field(default_factory=list)
    alerts: list[Mark] = field(default_factory=list)
    rejected: int = 0
    lines: int = 0

    def step_at(self, t: float | np.ndarray) -> Any:
        """The training step at wall time `t` (interpolated between step lines)."""
        if not len(self.steps):
            return np.zeros_like(np.asarray(t, dtype=float))
        return np.interp(t, self.step_t, self.steps)


_NUMBER = rb"(null|-?[0-9][-+.eE0-9]*)"
_ANY = rb"[^,]*"
# A step line as the monitor writes it (pipeline/monitor.py: the envelope, then step, epoch,
# epoch_progress, loss, acc, tau, lr, grad_norm, tokens, ktok_s, in that order): one regex
# scan over all of them reads 200,000 lines in about a second. Lines of another shape are
# decoded one by one instead.
_STEP_LINE = re.compile(
    rb'"t":' + _NUMBER + rb',"run":"(?:[^"\\]|\\.)*","kind":"step","step":([0-9]+),'
    rb'"epoch":' + _ANY + rb',"epoch_progress":' + _ANY + rb',"loss":' + _NUMBER
    + rb',"acc":' + _NUMBER + rb',"tau":' + _NUMBER + rb',"lr":' + _ANY
    + rb',"grad_norm":' + _ANY + rb',"tokens":' + _ANY + rb',"ktok_s":' + _NUMBER
)  # fmt: skip
_STEP_SHAPE = ("t", "step", *STEP_FIELDS)
_GPU_VALUES = re.compile(rb'"(index|util)":' + _NUMBER)
_KIND = re.compile(rb'"kind":\s*"([A-Za-z_]+)"')
_AVAILABLE = re.compile(rb'"available":\s*true')
# Kinds the report has no use for: never decoded.
_SKIPPED = frozenset({b"queue", b"profile", b"heartbeat", b"prepare"})


def _decode(raw: bytes) -> dict[str, Any] | None:
    line = protocol.decode_line(raw)
    if isinstance(line, protocol.Rejected):
        return None
    return {"kind": line.kind, "t": line.t, "run": line.run, **line.fields}


def _number(value: Any) -> float:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan
    )


def _floats(found: list[bytes] | tuple[bytes, ...]) -> np.ndarray:
    values = np.array(found, dtype="S")
    values[values == b"null"] = b"nan"
    return values.astype(np.float64)


def _step_columns(lines: list[bytes]) -> dict[str, np.ndarray] | None:
    """t, step and the figures of every step line in one regex scan; None when a line does
    not have the monitor's shape (another encoder), which the caller then decodes line by
    line."""
    found = _STEP_LINE.findall(b"\n".join(lines))
    if len(found) != len(lines):
        return None
    return {
        name: _floats(column)
        for name, column in zip(_STEP_SHAPE, zip(*found, strict=True), strict=True)
    }


def _gpu_columns(lines: list[bytes]) -> dict[int, np.ndarray] | None:
    """Every gpu line's utilisation per GPU index in one regex scan, when every line lists
    the same GPUs in the same order (sample_gpus does), each index before its util; None
    otherwise."""
    first = _GPU_VALUES.findall(lines[0])
    names = [name for name, _ in first]
    if not first or names != [b"index", b"util"] * (len(first) // 2):
        return None
    found = _GPU_VALUES.findall(b"\n".join(lines))
    if len(found) != len(first) * len(lines):
        return None
    grid = np.array(found, dtype="S").reshape(len(lines), len(first) // 2, 2, 2)
    # [line, gpu, (index|util), (name|value)]: every line the first line's names and GPUs
    if not (grid[:, :, :, 0] == grid[0, :, :, 0]).all():
        return None
    if not (grid[:, :, 0, 1] == grid[0, :, 0, 1]).all():
        return None
    utils = grid[:, :, 1, 1].copy()
    utils[utils == b"null"] = b"nan"
    values = utils.astype(np.float64)
    return {int(index): values[:, k] for k, index in enumerate(grid[0, :, 0, 1])}


def _gpu_rows_one_by_one(lines: list[bytes], series: RunSeries) -> dict[int, np.ndarray]:
    rows = []
    for raw in lines:
        obj = _decode(raw)
        if obj is None:
            series.rejected += 1
            rows.append({})
            continue
        gpus = [g for g in obj["gpus"] if isinstance(g, dict) and isinstance(g.get("index"), int)]
        rows.append({g["index"]: _number(g.get("util")) for g in gpus})
    indexes = sorted({i for row in rows for i in row})
    return {i: np.asarray([row.get(i, np.nan) for row in rows], dtype=float) for i in indexes}


def _gpu_roles(raw: bytes) -> dict[int, str]:
    """Roles do not change within a run: read from one line."""
    obj = _decode(raw)
    gpus = obj["gpus"] if obj else ()
    return {
        g["index"]: g["role"]
        for g in gpus
        if isinstance(g, dict)
        and isinstance(g.get("index"), int)
        and isinstance(g.get("role"), str)
    }


def read_run(path: Path) -> RunSeries:
    """One pass: each line's kind by a bytes search, the step lines' numbers by one regex
    scan, the gpu lines' by one per line, every other used line decoded and checked by
    protocol.py."""
    series = RunSeries(path)
    step_lines: list[bytes] = []
    gpu_lines: list[bytes] = []
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        series.lines += 1
        kind = _KIND.search(raw, 0, 320)
        name = kind.group(1) if kind else None
        if name in _SKIPPED:
            continue
        if name == b"step":
            step_lines.append(raw)
            continue
        if name == b"gpu":
            if _AVAILABLE.search(raw):  # a box without NVML says so and has no readings
                gpu_lines.append(raw)
            continue
        obj = _decode(raw)
        if obj is None:
            series.rejected += 1
            continue
        if obj["kind"] == "step":  # a step line the bytes search missed: kept the slow way
            step_lines.append(raw)
            continue
        t = obj["t"]
        series.first_t = t if series.first_t is None else min(series.first_t, t)
        series.last_t = t if series.last_t is None else max(series.last_t, t)
        _on_line(series, obj, _last_step(step_lines[-1]) if step_lines else 0, t)
    _set_steps(series, step_lines)
    if gpu_lines:
        series.gpu_t = np.asarray([line_time(raw) or np.nan for raw in gpu_lines], dtype=float)
        columns = _gpu_columns(gpu_lines)
        series.gpu_util = (
            columns if columns is not None else _gpu_rows_one_by_one(gpu_lines, series)
        )
        series.gpu_roles = _gpu_roles(gpu_lines[-1])
    return series


def _last_step(raw: bytes) -> int:
    found = re.search(rb'"step":([0-9]+)', raw)
    return int(found.group(1)) if found else 0


def _set_steps(series: RunSeries, lines: list[bytes]) -> None:
    columns = _step_columns(lines) if lines else None
    if columns is None:
        columns = {name: [] for name in _STEP_SHAPE}
        for raw in lines:
            obj = _decode(raw)
            if obj is None:
                series.rejected += 1
                continue
            for name in _STEP_SHAPE:
                columns[name].append(_number(obj.get(name)))
    series.steps = np.asarray(columns["step"], dtype=float)
    series.step_t = np.asarray(columns["t"], dtype=float)
    series.metrics = {name: np.asarray(columns[name], dtype=float) for name in STEP_FIELDS}
    if len(series.step_t):
        first, last = float(series.step_t.min()), float(series.step_t.max())
        series.first_t = first if series.first_t is None else min(series.first_t, first)
        series.last_t = last if series.last_t is None else max(series.last_t, last)


def _on_line(series: RunSeries, obj: dict[str, Any], step: int, t: float) -> None:
    kind = obj["kind"]
    if kind == "run_start":
        _on_start(series, obj, step, t)
    elif kind == "run_end":
        series.end = {k: v for k, v in obj.items() if k not in protocol.ENVELOPE}
    elif kind == "checkpoint":
        series.checkpoints.append(
            {"step": obj["step"], "t": t, "path": obj["path"], "seconds": obj["seconds"]}
        )
    elif kind == "event":
        _on_event(series, obj, step, t)


def _on_start(series: RunSeries, obj: dict[str, Any], step: int, t: float) -> None:
    if obj["run"] not in series.run_ids:
        series.run_ids.append(obj["run"])
    series.newest_start = {k: v for k, v in obj.items() if k not in protocol.ENVELOPE}
    if not series.start:
        series.start = series.newest_start
        return
    resumed = obj.get("start_step", step)
    series.restarts.append(Mark(float(resumed if isinstance(resumed, int) else step), t, "restart"))


# What an `eval` event reports beside its step and tau (missing ones read None).
_EVAL_FIGURES = (
    "tau_tf", "lossless", "mismatched", "prompts", "tokens", "seconds", "dtype", "blocks",
    "round_lengths", "tau_tf_seen",
)  # fmt: skip


def _on_event(series: RunSeries, obj: dict[str, Any], step: int, t: float) -> None:
    code = obj["code"]
    at = obj.get("step") if isinstance(obj.get("step"), int) else step
    if code == "eval" and any(isinstance(obj.get(k), (int, float)) for k in ("tau", "tau_tf")):
        figures = {k: obj.get(k) for k in _EVAL_FIGURES}
        series.evals.append({"step": obj["step"], "t": t, "tau": obj["tau"]} | figures)
    elif obj["level"] in ("warning", "error") and code not in _NOT_ALERTS:
        series.alerts.append(Mark(float(at), t, f"{code}: {obj['message']}", obj["level"]))
