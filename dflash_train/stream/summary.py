"""A decimated summary of a stream's past, so a console attaching to a days-old run draws
it at once: at most `points` lines per series (step metrics, per-GPU readings, queue
values), min/max-preserving, plus run_start/run_end/checkpoint/event lines kept whole up to
a cap. Every summary line is a normal protocol line with `"history": true` added.

One pass, bounded memory: lines fall into buckets of `width` consecutive lines; when there
are too many buckets, neighbours merge and `width` doubles. A bucket keeps its first and
last raw line and, per value, the min and max with the seq where each occurred.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dflash_train import protocol
from dflash_train.stream.reader import ENVELOPE_PREFIX, decoded, line_time

# A value's place in a line: ("loss",) or ("gpus", gpu_index, "util").
Key = tuple[Any, ...]
Extremum = tuple[float, int]  # (value, seq)
Columns = dict[Key, list[float | None]]

_NUMBER = rb"(null|-?[0-9][-+.eE0-9]*)"
# lr follows its schedule: the bucket's first and last values are enough.
_STEP_VALUES = ("loss", "acc", "tau", "grad_norm", "ktok_s")
_QUEUE_VALUES = ("hs_ready", "producer_wait", "consumer_wait", "starved")
# Per GPU, the console plots utilisation, power and memory; temperature shows the bucket's
# first and last readings. (In the order a gpu line lists them.)
_GPU_VALUES = ("util", "mem_used", "power_w")
_GPU_INDEX = re.compile(rb'"index":([0-9]+)')
EVAL_EVENTS = "eval_event"
_EVAL_CODE = b'"code":"eval"'
_EVAL_KEY = EVAL_EVENTS.encode()
# How many whole lines of each kind the summary keeps (the newest ones).
WHOLE_CAPS: dict[str, int] = {
    "run_start": 50,
    "run_end": 50,
    # A six-day run saving every 500 steps writes about 400.
    "checkpoint": 1000,
    "event": 500,
    # Held-out evaluations (`event` lines of code eval) apart from the other events, so
    # the whole run's held-out series survives however many other events there are.
    EVAL_EVENTS: 1000,
    # A prepare run's progress: the newest line is all the console draws of it.
    "prepare": 1,
}


def _numbers(found: list[bytes]) -> list[float | None]:
    try:
        return list(map(float, found))
    except ValueError:
        return [None if raw == b"null" else float(raw) for raw in found]


def _as_number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class _Scanner:
    """Pulls named numbers out of a batch of same-shaped lines in one regex scan: the
    names' order is read from the first and last line, and every line must repeat it;
    otherwise (a line from another writer) each line is decoded on its own."""

    def __init__(
        self,
        names: tuple[str, ...],
        readings: Callable[[dict[str, Any]], dict[Key, Any]] | None = None,
    ) -> None:
        alternatives = b"|".join(n.encode() for n in names)
        self.values = re.compile(b'"(?:' + alternatives + b')":' + _NUMBER)
        self.named = re.compile(b'"(' + alternatives + b')":' + _NUMBER)
        self.readings = readings or (lambda obj: {(name,): obj.get(name) for name in names})

    def columns(self, lines: list[bytes]) -> Columns:
        shape = self._shape(lines[0])
        found = self.values.findall(b"\n".join(lines))
        if not shape or shape != self._shape(lines[-1]) or len(found) != len(shape) * len(lines):
            return _decoded_columns(lines, self.readings)
        values = _numbers(found)
        width = len(shape)
        return {(name,): values[i::width] for i, name in enumerate(shape)}

    def _shape(self, line: bytes) -> list[str]:
        return [name.decode() for name, _ in self.named.findall(line)]


class _GpuScanner(_Scanner):
    """Per-GPU values. A gpu line lists the same GPUs in index order every time (it comes
    from sample_gpus), so the k-th GPU's values sit at fixed positions of every line;
    checked on the batch's first and last line and by counting readings."""

    def __init__(self) -> None:
        super().__init__(_GPU_VALUES, _gpu_readings)

    def columns(self, lines: list[bytes]) -> Columns:
        indexes = _GPU_INDEX.findall(lines[0])
        joined = b"\n".join(lines)
        if not indexes and b'"index":' not in joined:
            return {}  # no GPU readings at all (a box without NVML)
        per_line = len(indexes)
        if (
            not indexes
            or indexes != _GPU_INDEX.findall(lines[-1])
            or joined.count(b'"index":') != per_line * len(lines)
            or self._shape(lines[0]) != list(_GPU_VALUES) * per_line
        ):
            return _decoded_columns(lines, self.readings)
        found = self.values.findall(joined)
        width = len(_GPU_VALUES) * per_line
        if len(found) != width * len(lines):
            return _decoded_columns(lines, self.readings)
        values = _numbers(found)
        cols: Columns = {}
        for reading, index in enumerate(indexes):
            for offset, name in enumerate(_GPU_VALUES):
                start = reading * len(_GPU_VALUES) + offset
                cols[("gpus", int(index), name)] = values[start::width]
        return cols


def _gpu_readings(obj: dict[str, Any]) -> dict[Key, Any]:
    found: dict[Key, Any] = {}
    gpus = obj.get("gpus")
    for gpu in gpus if isinstance(gpus, list) else []:
        if isinstance(gpu, dict) and type(gpu.get("index")) is int:
            for name in _GPU_VALUES:
                found[("gpus", gpu["index"], name)] = gpu.get(name)
    return found


def _profile_columns(lines: list[bytes]) -> Columns:
    """Per-stage times of `profile` lines (one every 30 s: decoding each is cheap)."""
    return _decoded_columns(lines, _stage_readings)


def _stage_readings(obj: dict[str, Any]) -> dict[Key, Any]:
    stages = obj.get("stages_ms")
    if not isinstance(stages, dict):
        return {}
    return {("stages_ms", name): value for name, value in stages.items()}


def _decoded_columns(
    lines: list[bytes], readings: Callable[[dict[str, Any]], dict[Key, Any]]
) -> Columns:
    cols: Columns = {}
    for row, line in enumerate(lines):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            for key, value in readings(obj).items():
                cols.setdefault(key, [None] * len(lines))[row] = _as_number(value)
    return cols


@dataclass
class _Bucket:
    first: bytes
    first_seq: int
    last: bytes
    last_seq: int
    count: int
    lo: dict[Key, Extremum] = field(default_factory=dict)
    hi: dict[Key, Extremum] = field(default_factory=dict)

    @classmethod
    def of(cls, seqs: list[int], lines: list[bytes], cols: Columns) -> _Bucket:
        bucket = cls(lines[0], seqs[0], lines[-1], seqs[-1], len(lines))
        for key, values in cols.items():
            if None in values:
                pairs = [(v, s) for v, s in zip(values, seqs, strict=True) if v is not None]
                if pairs:
                    bucket.lo[key] = min(pairs, key=lambda p: p[0])
                    bucket.hi[key] = max(pairs, key=lambda p: p[0])
                continue
            low, high = min(values), max(values)  # type: ignore[type-var]
            bucket.lo[key] = (low, seqs[values.index(low)])  # type: ignore[arg-type]
            bucket.hi[key] = (high, seqs[values.index(high)])  # type: ignore[arg-type]
        return bucket

    def state(self) -> list[Any]:
        """JSON-ready (lines as latin-1 text: one code point per byte, any byte survives)."""
        return [
            self.first.decode("latin-1"), self.first_seq, self.last.decode("latin-1"),
            self.last_seq, self.count,
            [[list(k), v, s] for k, (v, s) in self.lo.items()],
            [[list(k), v, s] for k, (v, s) in self.hi.items()],
        ]  # fmt: skip

    @classmethod
    def from_state(cls, state: list[Any]) -> _Bucket:
        first, first_seq, last, last_seq, count, lo, hi = state
        bucket = cls(first.encode("latin-1"), first_seq, last.encode("latin-1"), last_seq, count)
        bucket.lo = {tuple(k): (v, s) for k, v, s in lo}
        bucket.hi = {tuple(k): (v, s) for k, v, s in hi}
        return bucket

    def merge(self, other: _Bucket) -> None:
        self.last, self.last_seq = other.last, other.last_seq
        self.count += other.count
        for key, (value, seq) in other.lo.items():
            low = self.lo.get(key)
            if low is None or value < low[0]:
                self.lo[key] = (value, seq)
        for key, (value, seq) in other.hi.items():
            high = self.hi.get(key)
            if high is None or value > high[0]:
                self.hi[key] = (value, seq)


def _set_value(obj: dict[str, Any], key: Key, value: float) -> None:
    if len(key) == 1:
        holders = [obj]
        name = key[0]
    elif len(key) == 2:  # ("stages_ms", stage)
        holder = obj.get(key[0])
        holders = [holder] if isinstance(holder, dict) else []
        name = key[1]
    else:
        field_name, index, name = key
        holders = [g for g in obj.get(field_name) or [] if isinstance(g, dict)]
        holders = [g for g in holders if g.get("index") == index]
    for holder in holders:
        # Keep integers integers (hs_ready is a count).
        is_int = isinstance(holder.get(name), int) and not isinstance(holder.get(name), bool)
        holder[name] = int(value) if is_int and value.is_integer() else value


def mark_history(line: bytes) -> bytes:
    """The same line with `"history": true` added (a status line ends in `}`)."""
    body = line.rstrip(b"\r\n ")
    return body[:-1] + b',"history":true}'


def _encode(obj: dict[str, Any]) -> bytes:
    obj["history"] = True
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


class SeriesDecimator:
    """Min/max-preserving decimation of one kind's lines to at most `points` lines. Lines
    gather into a batch of `width`; a full batch becomes a bucket in one vectorised scan."""

    def __init__(self, points: int, columns: Callable[[list[bytes]], Columns]) -> None:
        self.max_buckets = max(1, points // 2)
        self.columns = columns
        self.width = 1
        self.buckets: list[_Bucket] = []
        self.count = 0
        self._seqs: list[int] = []
        self._lines: list[bytes] = []

    def extend(self, seqs: list[int], lines: list[bytes]) -> None:
        self.count += len(lines)
        done = 0
        while done < len(lines):
            take = self.width - len(self._lines)
            self._seqs.extend(seqs[done : done + take])
            self._lines.extend(lines[done : done + take])
            done += take
            if len(self._lines) >= self.width:
                self._flush()

    def _flush(self) -> None:
        if not self._lines:
            return
        self.buckets.append(_Bucket.of(self._seqs, self._lines, self.columns(self._lines)))
        self._seqs, self._lines = [], []
        if len(self.buckets) > self.max_buckets:
            self._halve()

    def _halve(self) -> None:
        merged = []
        for i in range(0, len(self.buckets), 2):
            head = self.buckets[i]
            if i + 1 < len(self.buckets):
                head.merge(self.buckets[i + 1])
            merged.append(head)
        self.buckets = merged
        self.width *= 2

    def state(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "count": self.count,
            "buckets": [bucket.state() for bucket in self.buckets],
            "pending": [self._seqs, [line.decode("latin-1") for line in self._lines]],
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.width, self.count = int(state["width"]), int(state["count"])
        self.buckets = [_Bucket.from_state(b) for b in state["buckets"]]
        seqs, lines = state["pending"]
        self._seqs, self._lines = list(seqs), [line.encode("latin-1") for line in lines]

    def lines(self) -> list[tuple[int, bytes]]:
        # On a copy: flushing the pending batch merges buckets in place, and this summary
        # may go on taking lines after (it is saved and resumed by the next attach).
        clone = copy.copy(self)
        # A bucket's lines and extrema are immutable: copying its two dicts is enough (a
        # deepcopy of them cost a first attach 0.1 s).
        clone.buckets = [dataclasses.replace(b, lo=dict(b.lo), hi=dict(b.hi)) for b in self.buckets]
        clone._seqs, clone._lines = list(self._seqs), list(self._lines)
        return clone._summary_lines()

    def _summary_lines(self) -> list[tuple[int, bytes]]:
        self._flush()
        out: list[tuple[int, bytes]] = []
        for bucket in self.buckets:
            if bucket.count <= 2:
                out.append((bucket.first_seq, mark_history(bucket.first)))
                if bucket.count == 2:
                    out.append((bucket.last_seq, mark_history(bucket.last)))
                continue
            early, late = json.loads(bucket.first), json.loads(bucket.last)
            for key, low in bucket.lo.items():
                high = bucket.hi[key]
                first, second = (low, high) if low[1] <= high[1] else (high, low)
                _set_value(early, key, first[0])
                _set_value(late, key, second[0])
            out.append((bucket.first_seq, _encode(early)))
            out.append((bucket.last_seq, _encode(late)))
        return out


class HistorySummary:
    """Feed the past with `add_block`; `lines()` gives the summary in seq order."""

    def __init__(self, points: int) -> None:
        self.points = points
        self._clear()

    def _clear(self) -> None:
        points = self.points
        self.series: dict[str, SeriesDecimator] = {
            "step": SeriesDecimator(points, _Scanner(_STEP_VALUES).columns),
            "queue": SeriesDecimator(points, _Scanner(_QUEUE_VALUES).columns),
            "gpu": SeriesDecimator(points, _GpuScanner().columns),
            "profile": SeriesDecimator(points, _profile_columns),
        }
        self.whole: dict[str, deque[tuple[int, bytes]]] = {
            kind: deque(maxlen=cap) for kind, cap in WHOLE_CAPS.items()
        }
        self._whole_raw = {kind.encode(): kept for kind, kept in self.whole.items()}
        self.lines_in = 0
        self.run: str | None = None
        self._run_raw: bytes | None = None
        self.last_seq = -1
        # The box-clock time of the newest line summarised, whatever its kind (heartbeats
        # leave no line in the summary but still say the trainer lived then).
        self.last_t: float | None = None

    def add_block(self, block: bytes, after_seq: int) -> None:
        """Take a block of complete lines (newline-separated); lines with seq at or below
        `after_seq` and lines that are not status lines are left out. This loop runs once
        per line of a possibly huge stream, so it stays flat: kinds are compared as raw
        bytes and series lines are handed over once per block."""
        match = ENVELOPE_PREFIX.match
        pending: dict[bytes, tuple[list[int], list[bytes]]] = {
            kind.encode(): ([], []) for kind in self.series
        }
        whole = self._whole_raw
        newest: bytes | None = None
        for line in block.split(b"\n"):
            found = match(line)
            if found is None:
                continue
            raw_seq, raw_run, raw_kind = found.group("seq", "run", "kind")
            seq = int(raw_seq)
            if seq <= after_seq:
                continue
            if raw_run != self._run_raw:
                self._hand_over(pending)
                self._switch_run(raw_run)
                whole = self._whole_raw
            self.lines_in += 1
            self.last_seq = seq
            newest = line
            series = pending.get(raw_kind)
            if series is not None:
                series[0].append(seq)
                series[1].append(line)
                continue
            kept = whole.get(raw_kind)
            if raw_kind == b"event" and _EVAL_CODE in line:
                kept = whole[_EVAL_KEY]
            if kept is not None:
                kept.append((seq, line))
        self._hand_over(pending)
        if newest is not None:
            self.last_t = line_time(newest)

    def _hand_over(self, pending: dict[bytes, tuple[list[int], list[bytes]]]) -> None:
        for raw_kind, (seqs, lines) in pending.items():
            if lines:
                self.series[raw_kind.decode()].extend(seqs, lines)
                seqs.clear()
                lines.clear()

    def _switch_run(self, raw_run: bytes) -> None:
        if self._run_raw is not None:
            # The stream was replaced by a new run's: forget the old one.
            self._clear()
        self._run_raw = raw_run
        self.run = decoded(raw_run)

    def state(self) -> dict[str, Any]:
        """Everything needed to go on summarising later, JSON-ready."""
        return {
            "points": self.points,
            "series": {kind: series.state() for kind, series in self.series.items()},
            "whole": {
                kind: [[seq, line.decode("latin-1")] for seq, line in kept]
                for kind, kept in self.whole.items()
            },
            "lines_in": self.lines_in,
            "run": None if self._run_raw is None else self._run_raw.decode("latin-1"),
            "last_seq": self.last_seq,
            "last_t": self.last_t,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HistorySummary:
        summary = cls(int(state["points"]))
        for kind, series in summary.series.items():
            series.restore(state["series"][kind])
        for kind, kept in summary.whole.items():
            saved = state["whole"].get(kind, ())  # eval_event: absent from older summaries
            kept.extend((int(seq), line.encode("latin-1")) for seq, line in saved)
        summary.lines_in = int(state["lines_in"])
        if state["run"] is not None:
            summary._run_raw = state["run"].encode("latin-1")
            summary.run = decoded(summary._run_raw)
        summary.last_seq = int(state["last_seq"])
        last_t = state.get("last_t")  # absent from summaries saved before it was kept
        summary.last_t = float(last_t) if isinstance(last_t, (int, float)) else None
        return summary

    def lines(self) -> list[bytes]:
        picked: list[tuple[int, bytes]] = []
        for series in self.series.values():
            picked.extend(series.lines())
        for kept in self.whole.values():
            picked.extend((seq, mark_history(line)) for seq, line in kept)
        picked.sort(key=lambda item: item[0])
        return [line for _, line in picked]

    def end_marker(self) -> bytes | None:
        """The `history_end` event: after it, lines are live and `cursor` is the seq the
        summary covered. None when the past was empty."""
        if self.run is None or self.last_seq < 0:
            return None
        return end_marker(self.run, self.last_seq, self.lines_in, self.last_t)


def end_marker(run: str, last_seq: int, lines_in: int, last_t: float | None) -> bytes:
    """Stamped with the box's clock as it is sent: `t - last_t` is how long the run had
    been silent, on one clock, whatever the console's clock says."""
    extra = {} if last_t is None else {"last_t": last_t}
    text = protocol.encode_line(
        "event",
        seq=last_seq,
        run=run,
        level="info",
        code=protocol.HISTORY_END,
        message=f"history: {lines_in} lines summarised",
        history=True,
        cursor=last_seq,
        lines_summarised=lines_in,
        **extra,
    )
    return text.rstrip("\n").encode("utf-8")
