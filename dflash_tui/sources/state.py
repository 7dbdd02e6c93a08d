"""RunState: a pure reducer from status lines to what the console draws, in bounded memory:
recent ring buffers, and the whole run's history of every plotted series (`run_history`).
A new run id starts a fresh state: runs are never mixed."""

from __future__ import annotations

import math
import operator
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_train.protocol import (
    DEFAULT_SETTINGS,
    GPUS_RUN_ID,
    LIVE_SETTINGS,
    RESTART_FAILED,
    TRAINER_GONE,
    Rejected,
    Reply,
    StatusLine,
    eval_score,
    round_shares,
)
from dflash_tui.sources.advised_split import SPLIT_ADVICE, AdvisedSplit, read_advice
from dflash_tui.sources.bucket_level import SeriesView
from dflash_tui.sources.pace import SegmentPace, eta_s
from dflash_tui.sources.run_history import RECENT_GPU_ROWS, RowGroup, RunHistory

STEP_METRICS = ("loss", "acc", "tau", "ktok_s", "lr", "grad_norm")
QUEUE_VALUES = ("hs_ready", "producer_wait", "consumer_wait", "starved")
GPU_VALUES = ("util", "power_w", "mem_used", "temp_c")
PREPARE_RATE = "prepare_tok_s"  # the history series of a prepare's answer tokens/s
# How far back a prepare's rate "now" reaches. Its lines come every ~2 s, and on an H200 the
# answer tokens between two of them swung from 0 to 92,000 a second (a batch ends, a chunk is
# written) around a steady 69,000: one pair of lines is noise, 10 s of them is the rate.
PREPARE_RATE_WINDOW_S = 10.0
# Per-GPU values kept over the whole run (the heatmap's choices).
GPU_HISTORY_VALUES = ("util", "power_w")
CHECKPOINTS_KEPT = 2000
_step_values = operator.itemgetter(*STEP_METRICS)
STALL_AFTER_S = 60.0
# run_end reason -> the run's state: a signal is an operator's stop (resumable).
END_STATES = {"completed": "finished", "signal": "stopped", "error": "crashed"}
# Longest pass between a restart's two trainers that reads RESTARTING: the box's restart
# waits up to its --wait (verification) after a stop of up to --timeout; past this the
# restarter is taken to have died and the run reads by its run_end.
RESTART_WAIT_S = 600.0
_SETTING_IN_MESSAGE = re.compile(r"\b(" + "|".join(LIVE_SETTINGS) + r")\s*[=:]\s*(\d+)")

Series = deque[tuple[float, float]]


@dataclass(frozen=True)
class EventRecord:
    """One entry of the run's event log: an `event` line, a checkpoint or the run's end."""

    t: float
    seq: int
    level: str
    code: str
    text: str


@dataclass(frozen=True)
class HeldoutTau:
    """One held-out evaluation (an `eval` event): the step, real and teacher-forced tau.
    A hybrid target's is teacher-forced only (tau and lossless None)."""

    step: int
    tau: float | None
    tau_tf: float | None
    lossless: bool | None
    # The share of its decoding rounds that kept the first draft (protocol.round_shares of
    # the event's round_lengths); None when the event has none (a hybrid's, an older box's).
    first_kept: float | None = None

    @property
    def teacher_forced_only(self) -> bool:
        return self.tau is None

    @property
    def score(self) -> float:
        """What ranks it and is shown: real tau, else the teacher-forced one."""
        return float(self.tau if self.tau is not None else self.tau_tf or 0.0)


def listed_score(checkpoint: Mapping[str, Any]) -> float | None:
    """A checkpoint's held-out score as the box lists it (`status`'s checkpoint_list), by
    the box's own rule: its tau, else (a hybrid target's) its teacher-forced tau."""
    return eval_score(checkpoint)


def silence(sent_at: float, last_t: float, now: float) -> float:
    """How long a run had written nothing when the history's end marker was sent at
    `sent_at` (the box's clock, as `last_t`): the smaller of that and the console's own
    clock's `now - last_t`, so neither clock alone (a box clock stepped, a laptop running
    ahead) makes a stall."""
    return max(0.0, min(sent_at - last_t, now - last_t))


class RunState:
    """Feed it every decoded line with `apply` (and rejects with `count_rejected`); read
    the attributes to draw. `clock` stamps when lines arrive, for staleness."""

    def __init__(
        self,
        *,
        history: int = 4096,
        gpu_history: int = 1024,
        events: int = 500,
        stall_after: float = STALL_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._history = history
        self._gpu_history = gpu_history
        self._events = events
        self.stall_after = stall_after
        self.clock = clock
        self.rejected_lines: Counter[str] = Counter()
        # GPU readings belong to the box, not to a run: a new run id keeps them.
        self._gpus: dict[int, Mapping[str, Any]] = {}
        self.gpu_series: dict[str, Series] = {}
        self._gpu_rows: dict[int, tuple[Series, ...]] = {}
        self.gpu_available: bool | None = None
        self.gpu_unavailable: str | None = None
        self.last_gpu_arrival: float | None = None
        # Per-GPU whole-run history, on the stream's clock (x: the run's step at the time).
        self.gpu_timeline = RunHistory()
        self._gpu_groups: dict[tuple[int, ...], RowGroup] = {}
        self._reset(None)

    def _reset(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.start: StatusLine | None = None
        self.end: StatusLine | None = None
        self.config: Mapping[str, Any] = {}
        self.topology: Mapping[str, Any] = {}
        self.epoch: int | None = None
        self.epochs: int | None = None
        self.epoch_progress: float | None = None
        self.step: int | None = None
        self.total_steps: int | None = None
        self.tokens: int | None = None
        self.current: dict[str, float | None] = dict.fromkeys(STEP_METRICS)
        self.queue: Mapping[str, Any] | None = None
        self.queue_series: dict[str, Series] = {
            v: deque(maxlen=self._history) for v in QUEUE_VALUES
        }
        self.settings: dict[str, int] = {}
        self.events: deque[EventRecord] = deque(maxlen=self._events)
        self.checkpoint: StatusLine | None = None
        self.checkpoints: deque[StatusLine] = deque(maxlen=CHECKPOINTS_KEPT)
        self.profile: StatusLine | None = None
        # "prepare" for a launched prepare (run_start's mode), whose `prepare` lines
        # are its progress; "train" otherwise.
        self.mode = "train"
        self.prepare: StatusLine | None = None
        # Answer tokens a second over its newest PREPARE_RATE_WINDOW_S of progress lines
        # (the lines' own tokens_per_s is the average since generation began).
        self.prepare_rate: float | None = None
        self._prepare_points: deque[tuple[float, int]] = deque()
        # The newest held-out evaluation, and each evaluated step's (the checkpoints' scores).
        self.heldout: HeldoutTau | None = None
        self.heldout_scores: dict[int, HeldoutTau] = {}
        self.history = RunHistory()
        # The newest `history` step lines whole: the zoomed plots and `metrics` read them.
        self._step_rows = self.history.group(STEP_METRICS, recent=self._history)
        self.last_seq: int | None = None
        self.last_time: float | None = None
        self.last_arrival: float | None = None
        self.crashed_by_status = False
        # The box said the restart that ended this run did not bring its next trainer up.
        self.restart_failed = False
        # The trainer's newest split advice since the latest run_start (a trainer started
        # since was not the one advised).
        self.split_advice: AdvisedSplit | None = None
        self.lines_applied = 0
        self.pace = SegmentPace()

    # -----------------------------------------------------------------------------------
    # Reducing

    def apply(self, line: StatusLine) -> None:
        kind = line.kind
        if line.run == GPUS_RUN_ID and kind == "gpu":
            self.apply_gpu_reading(line)
            return
        if line.run != self.run_id:
            self._reset(line.run)
        self.lines_applied += 1
        self.last_seq = line.seq
        arrived = self.clock()
        if kind == "event" and line.get("code") == TRAINER_GONE:
            # The box's word that the trainer died without run_end: not a line of the
            # trainer's, so the run's silence goes on.
            self.crashed_by_status = True
            self._record(line, "error", TRAINER_GONE, line["message"])
            return
        if kind == "event" and line.get("code") == "history_end":
            # The marker dates the run's newest line (an older box's leaves the newest line
            # the summary kept); that line, not the attach, is when the run last spoke.
            last_t = line.get("last_t")
            if isinstance(last_t, (int, float)) and not isinstance(last_t, bool):
                self.last_time = float(last_t)
            if self.last_time is not None:
                arrived -= silence(line.t, self.last_time, arrived)
        else:
            self.last_time = line.t
        self.last_arrival = arrived
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, line)

    def count_rejected(self, rejected: Rejected) -> None:
        self.rejected_lines[rejected.code] += 1

    def apply_status(self, reply: Reply) -> None:
        """Take the box's own verdict (`dflash-train status`) into account: it knows about a
        trainer that died without writing run_end."""
        if reply.ok and reply.data.get("state") == "crashed":
            self.crashed_by_status = True

    def _apply_start(self, line: StatusLine) -> None:
        self.start = line
        self.end = None
        self.crashed_by_status = False
        self.restart_failed = False
        self.split_advice = None
        config = line["config"]
        self.config = config
        self.topology = line["topology"]
        self.total_steps = line["total_steps"]
        self.mode = str(line.get("mode") or "train")
        epochs = config.get("epochs")
        self.epochs = epochs if isinstance(epochs, int) else self.epochs
        for key in LIVE_SETTINGS:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.settings[key] = value
        start_step = line.get("start_step")
        if isinstance(start_step, int):
            self.step = start_step
        resumed = bool(line.get("resumed_from")) or bool(start_step)
        self.history.mark("resume" if resumed else "start", self.step or 0, line.t)
        if not line.get("history"):
            self.pace.restart()  # the ETA follows this segment's pace only

    def _apply_prepare(self, line: StatusLine) -> None:
        self.prepare = line
        rate = _prepare_rate(self._prepare_points, line)
        self.prepare_rate = rate
        self.history.add(PREPARE_RATE, float(line["answer_tokens"]), rate, line.t)

    def _apply_step(self, line: StatusLine) -> None:
        fields = line.fields
        step = fields["step"]
        self.step = step
        self.epoch = fields["epoch"]
        self.epoch_progress = fields["epoch_progress"]
        self.tokens = fields["tokens"]
        values = _step_values(fields)
        self.current.update(zip(STEP_METRICS, values, strict=True))
        self._step_rows.add(step, line.t, values)
        if not fields.get("history"):
            # Decimated history points are too sparse for a rate; live steps are not.
            self.pace.add(step, line.t)

    def _apply_queue(self, line: StatusLine) -> None:
        fields = line.fields
        self.queue = fields
        for key in LIVE_SETTINGS:
            self.settings[key] = fields[key]
        t = line.t
        for name in QUEUE_VALUES:
            self.queue_series[name].append((t, fields[name]))
        step = self.step or 0
        self.history.add("starved", step, fields["starved"], t)
        self.history.add("hs_ready", step, fields["hs_ready"], t)

    def apply_gpu_reading(self, line: StatusLine) -> None:
        """A `gpu` line from the trainer or from `gpus --follow` (box telemetry between
        runs): updates the GPU table without touching the run."""
        if line.kind == "gpu":
            self._apply_gpu(line)

    def _apply_gpu(self, line: StatusLine) -> None:
        available = line["available"]
        self.gpu_available = available
        reason = line.get("reason")
        self.gpu_unavailable = None if available else str(reason or "NVML unavailable")
        self.last_gpu_arrival = self.clock()
        t = line.t
        gpus = line["gpus"]
        indexes = tuple(gpu["index"] for gpu in gpus)
        rows = self._gpu_groups.get(indexes)
        if rows is None:
            names = tuple(f"gpu{i}.{name}" for i in indexes for name in GPU_HISTORY_VALUES)
            rows = self._gpu_groups[indexes] = self.gpu_timeline.group(
                names, recent=RECENT_GPU_ROWS
            )
        values = tuple(gpu.get(name) for gpu in gpus for name in GPU_HISTORY_VALUES)
        # The whole-run levels merge rows by x: a prepare has no steps (every row at step 0
        # merged into one point, the GPU history showing only the newest reading), so its
        # rows go by time.
        rows.add(t if self.mode == "prepare" else self.step or 0, t, values)
        for gpu in gpus:
            index = gpu["index"]
            self._gpus[index] = gpu
            rows = self._gpu_rows.get(index)
            if rows is None:
                rows = self._gpu_rows[index] = self._new_gpu_rows(index)
            for name, series in zip(GPU_VALUES, rows, strict=True):
                value = gpu.get(name)
                if value is not None:
                    series.append((t, value))

    def _new_gpu_rows(self, index: int) -> tuple[Series, ...]:
        rows = tuple(deque(maxlen=self._gpu_history) for _ in GPU_VALUES)
        for name, series in zip(GPU_VALUES, rows, strict=True):
            self.gpu_series[f"gpu{index}.{name}"] = series
        return rows

    def _record(self, line: StatusLine, level: str, code: str, text: str) -> None:
        self.events.append(EventRecord(line.t, line.seq, level, code, text))

    def _apply_event(self, line: StatusLine) -> None:
        self._record(line, line["level"], line["code"], line["message"])
        if line["code"] == "control_applied":
            settings = line.get("settings")
            if isinstance(settings, Mapping):
                pairs = [(k, v) for k, v in settings.items() if k in LIVE_SETTINGS]
            else:
                pairs = _SETTING_IN_MESSAGE.findall(line["message"])
            for key, value in pairs:
                self.settings[key] = int(value)
        elif line["code"] == RESTART_FAILED:
            self.restart_failed = True
        elif line["code"] == SPLIT_ADVICE:
            self.split_advice = read_advice(line) or self.split_advice
        elif line["code"] == "epoch_end" and isinstance(line.get("epoch"), int):
            self.epoch = line["epoch"]
        elif line["code"] == "eval" and eval_score(line.fields) is not None:
            self._apply_eval(line)

    def _apply_eval(self, line: StatusLine) -> None:
        """A held-out evaluation (protocol.EVENT_CODE_FIELDS): real speculative decoding's
        tau and the teacher-forced one, plotted against the step evaluated; the newest step
        is the header's, and each step's is its checkpoint's score. An evaluation by hand
        of an older checkpoint is only its score: the series run forward in steps."""
        step = line.get("step")
        if not isinstance(step, int):
            return
        tau_tf = line.get("tau_tf")
        tau = float(line["tau"]) if _is_number(line.get("tau")) else None
        lossless = None if tau is None else bool(line.get("lossless"))
        lengths = line.get("round_lengths")
        counts = lengths if isinstance(lengths, list) and all(map(_is_count, lengths)) else []
        first_kept = round_shares(counts, (1,)).get(1)
        held = HeldoutTau(step, tau, tau_tf if _is_number(tau_tf) else None, lossless, first_kept)
        self.heldout_scores[step] = held
        if self.heldout is not None and step < self.heldout.step:
            return
        self.heldout = held
        if held.tau is not None:
            self.history.add("eval_tau", step, held.tau, line.t)
        if _is_number(tau_tf):
            self.history.add("eval_tau_tf", step, tau_tf, line.t)

    def _apply_checkpoint(self, line: StatusLine) -> None:
        self.checkpoint = line
        self.checkpoints.append(line)
        self.history.mark("checkpoint", line["step"], line.t)
        text = f"checkpoint at step {line['step']} ({line['seconds']:.1f} s): {line['path']}"
        self._record(line, "info", "checkpoint", text)

    def _apply_profile(self, line: StatusLine) -> None:
        self.profile = line
        step = self.step or 0
        for stage, ms in line["stages_ms"].items():
            if _is_number(ms):
                self.history.add(f"stage.{stage}", step, ms, line.t)

    def _apply_end(self, line: StatusLine) -> None:
        self.end = line
        self.history.mark("end", self.step or 0, line.t)
        reason = line["reason"]
        text = f"run ended: {reason} (exit {line['exit_code']})"
        samples, unanswered = line.get("samples"), line.get("unanswered")
        if isinstance(samples, int) and isinstance(unanswered, int) and unanswered > 0:
            # A prepare cut by --max-seconds completes too: "completed" alone read as done.
            text += f": {samples:,} answered, {unanswered:,} not answered"
        tail = line.get("error_tail")
        if isinstance(tail, str) and tail.strip():
            text += ": " + tail.strip().splitlines()[-1]
        self._record(line, "error" if reason == "error" else "info", "run_end", text)

    # -----------------------------------------------------------------------------------
    # Reading

    @property
    def gpus(self) -> list[Mapping[str, Any]]:
        """The latest reading of each GPU, by index."""
        return [self._gpus[i] for i in sorted(self._gpus)]

    @property
    def gpu_history(self) -> dict[int, list[float]]:
        """Each GPU's utilisation history (oldest first), for sparklines."""
        history = {}
        for index in self._gpus:
            series = self.gpu_series.get(f"gpu{index}.util", ())
            history[index] = [value for _, value in series]
        return history

    def latest(self, name: str) -> float | None:
        """The newest value of a step metric (None when the trainer sent null)."""
        return self.current[name]

    @property
    def metrics(self) -> dict[str, list[tuple[float, float]]]:
        """Each step metric's newest points as (step, value), oldest first: the step lines
        kept whole (at most `history`), nulls left out."""
        rows = self._step_rows.recent
        return {
            name: [(row[0], row[2][i]) for row in rows if row[2][i] is not None]
            for i, name in enumerate(STEP_METRICS)
        }

    def average_ktok_s(self, window: int = 100) -> float | None:
        rows = self._step_rows.recent
        i = STEP_METRICS.index("ktok_s")
        recent = [rows[-k][2][i] for k in range(1, min(window, len(rows)) + 1)]
        recent = [v for v in recent if v is not None]
        return sum(recent) / len(recent) if recent else None

    def last_line_age(self, now: float | None = None) -> float | None:
        """Seconds since the last line of this run arrived (on `clock`; for the history's
        last line, since the box wrote it), None before any."""
        if self.last_arrival is None:
            return None
        return max(0.0, (self.clock() if now is None else now) - self.last_arrival)

    def end_state(self, now: float | None = None) -> str:
        """The state an ended run reads: its run_end's reason, except that a run ended by
        a restart reads restarting until its next trainer speaks (a new run_start), the
        box says the restart failed, or RESTART_WAIT_S pass (a restarter that died)."""
        assert self.end is not None
        if self.end.get("restarting") is True and not self.restart_failed:
            age = self.last_line_age(now)
            if age is None or age <= RESTART_WAIT_S:
                return "restarting"
        return END_STATES.get(self.end["reason"], "finished")

    def state_at(self, now: float | None = None) -> str:
        if self.end is not None:
            return self.end_state(now)
        if self.crashed_by_status:
            return "crashed"
        if self.last_arrival is None:
            return "not_started"
        age = self.last_line_age(now)
        if age is not None and age > self.stall_after:
            return "stalled"
        return "preparing" if self.mode == "prepare" else "running"

    @property
    def run_state(self) -> str:
        """RUN_STATES: running | finished | stopped | crashed | stalled | not_started |
        restarting, and preparing (a launched prepare)."""
        return self.state_at()

    @property
    def settings_in_force(self) -> dict[str, int]:
        return {**DEFAULT_SETTINGS, **self.settings} if self.settings else {}

    @property
    def steps_per_s(self) -> float | None:
        return self.pace.steps_per_s

    @property
    def eta_s(self) -> float | None:
        """Only a running run has one: a stopped, crashed or stalled one is not going."""
        if self.run_state != "running":
            return None
        return eta_s(self.steps_per_s, self.step, self.total_steps)

    def since(self, span_s: float | None) -> float | None:
        """Start time of the newest `span_s` seconds of the run; None (whole run) for None."""
        return self.history.since(span_s)

    def gpu_view(self, index: int, value: str, span_s: float | None, width: int) -> SeriesView:
        """GPU `index`'s `value` (util, power_w) over the range, against time. The whole
        run starts at the run's first line: readings from before it belong to the box."""
        since = self.since(span_s) if span_s is not None else self.history.first_t
        return self.gpu_timeline.view(f"gpu{index}.{value}", since, width, by_time=True)

    def series(self, name: str, width: int) -> list[tuple[float, float]]:
        """Points of a series ("loss", "queue.hs_ready", "gpu0.util", ...) decimated to
        at most `width` points, keeping each column's minimum and maximum. A step metric
        spans the whole run (its history, as plotted); the others their recent ring."""
        if name in STEP_METRICS:
            xs, ys = self.history.view(name, None, max(1, width // 2)).envelope()
            return list(zip(xs, ys, strict=True))
        return decimate(self._series(name), width)

    def series_names(self) -> list[str]:
        names = list(STEP_METRICS) + [f"queue.{v}" for v in QUEUE_VALUES]
        return names + sorted(self.gpu_series)

    def _series(self, name: str) -> Series | list[tuple[float, float]]:
        if name in STEP_METRICS:
            return self.metrics[name]
        if name.startswith("queue.") and name[6:] in self.queue_series:
            return self.queue_series[name[6:]]
        if name in self.gpu_series:
            return self.gpu_series[name]
        if name.startswith("gpu"):
            return deque()
        raise KeyError(f"series: unknown name {name!r}")


def decimate(points: Series | list[tuple[float, float]], width: int) -> list[tuple[float, float]]:
    """Min/max decimation: split into width // 2 buckets of consecutive points and keep
    each bucket's lowest and highest point, in x order, so spikes survive."""
    n = len(points)
    if width < 1:
        raise ValueError(f"width: must be at least 1, got {width}")
    if n <= width:
        return list(points)
    data = list(points)
    buckets = max(1, width // 2)
    out: list[tuple[float, float]] = []
    for b in range(buckets):
        chunk = data[b * n // buckets : (b + 1) * n // buckets]
        if not chunk:
            continue
        lo = min(chunk, key=_y)
        hi = max(chunk, key=_y)
        if lo is hi:
            out.append(lo)
        elif lo[0] <= hi[0]:
            out += (lo, hi)
        else:
            out += (hi, lo)
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _y(point: tuple[float, float]) -> float:
    y = point[1]
    return y if not math.isnan(y) else -math.inf


_HANDLERS: dict[str, Callable[[RunState, StatusLine], None]] = {
    "run_start": RunState._apply_start,
    "step": RunState._apply_step,
    "queue": RunState._apply_queue,
    "gpu": RunState._apply_gpu,
    "event": RunState._apply_event,
    "checkpoint": RunState._apply_checkpoint,
    "profile": RunState._apply_profile,
    "run_end": RunState._apply_end,
    "prepare": RunState._apply_prepare,
}


def _prepare_rate(points: deque[tuple[float, int]], line: StatusLine) -> float | None:
    """Answer tokens a second over the newest PREPARE_RATE_WINDOW_S of progress lines
    (`points`: their times and answer tokens, kept here); the line's own average for the
    first one, or when the count went back (a prepare started again)."""
    tokens = int(line["answer_tokens"])
    if points and tokens < points[-1][1]:
        points.clear()
    points.append((line.t, tokens))
    # The oldest point kept is the newest one at least the window back, once there is one.
    while len(points) > 2 and line.t - points[1][0] >= PREPARE_RATE_WINDOW_S:
        points.popleft()
    if len(points) == 1:
        return float(line["tokens_per_s"])
    first_t, first_tokens = points[0]
    seconds = line.t - first_t
    if seconds <= 0:
        return None  # every line at one moment (a replayed burst): no rate of its own
    return (tokens - first_tokens) / seconds
