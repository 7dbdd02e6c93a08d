"""Drawing one metric's whole-run history into a plotext plot: the raw series as each
column's low and high (spikes survive), a smoothed line of the columns' means, vertical
markers for checkpoints, (re)starts and the run's end, and an x axis in steps or wall time.
What can be plotted is the `PLOTS` table; the panes cycle through it."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from textual_plotext import PlotextPlot

from dflash_tui.sources.bucket_level import SeriesView
from dflash_tui.sources.run_history import RANGES, Marker, RunHistory

SMOOTHING_WINDOW = 9
# More checkpoint lines than this in view would hide the curve: every k-th is drawn.
MAX_CHECKPOINT_LINES = 12
MARKER_COLOURS = {"checkpoint": "gray", "start": "green", "resume": "green", "end": "red"}
LINE_COLOURS = ("cyan", "orange", "magenta", "green", "red", "yellow", "blue")


@dataclass(frozen=True)
class PlotChoice:
    """One entry of the `v` cycle. `series`: the names drawn (a name ending in "." means
    every series with that prefix, one line each); `smoothed`: a smoothed line over it."""

    id: str
    title: str
    series: tuple[str, ...]
    smoothed: bool = False
    labels: tuple[str, ...] = ()
    x_title: str = "step"  # what the x axis counts when it is not wall time


PLOTS: tuple[PlotChoice, ...] = (
    PlotChoice("loss", "loss", ("loss",), smoothed=True),
    PlotChoice("acc", "accuracy", ("acc",)),
    # Training tau (teacher-forced on the training batches) against the held-out
    # evaluations' (`eval` events): real speculative decoding's and teacher-forced.
    PlotChoice(
        "tau",
        "tau",
        ("tau", "eval_tau", "eval_tau_tf"),
        labels=("train tf", "held-out", "held-out tf"),
    ),
    PlotChoice("grad_norm", "grad norm", ("grad_norm",)),
    PlotChoice("lr", "learning rate", ("lr",)),
    PlotChoice("ktok_s", "Ktok/s", ("ktok_s",), smoothed=True),
    PlotChoice("stages", "stage ms", ("stage.",)),
    PlotChoice("starved", "drafter starved", ("starved",)),
)
PLOT_IDS = tuple(choice.id for choice in PLOTS)
# A launched prepare's answer tokens a second (between its progress lines) against the
# answer tokens made (every line moves it; answers done move a chunk at a time): the
# throughput pane's plot while a run prepares (not in the `v` cycle).
PREPARE_TOK_S = PlotChoice(
    "prepare_tok_s", "answer tok/s", ("prepare_tok_s",), smoothed=True, x_title="answer tokens"
)


@dataclass(frozen=True)
class PlotView:
    """How every plot is drawn now: the range (index into RANGES) and the x axis."""

    range_index: int = 0
    by_time: bool = False

    @property
    def span_s(self) -> float | None:
        return RANGES[self.range_index][1]

    @property
    def range_name(self) -> str:
        return RANGES[self.range_index][0]

    def label(self, counted: str = "steps") -> str:
        """The range and the x axis: wall time, or what the x axis counts."""
        return f"{self.range_name} · {'time' if self.by_time else counted}"


def smoothed(values: Sequence[float], window: int = SMOOTHING_WINDOW) -> list[float]:
    """Centred moving average; the ends use the points they have."""
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half) : i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def series_names(history: RunHistory, choice: PlotChoice) -> list[str]:
    names: list[str] = []
    for name in choice.series:
        names += history.names(name) if name.endswith(".") else [name]
    return names


def time_format(span_s: float) -> str:
    """Days apart: the date too; within the hour: the seconds."""
    return "%m-%d %H:%M" if span_s > 86_400 else "%H:%M" if span_s > 3600 else "%H:%M:%S"


def time_ticks(first: float, last: float, count: int = 4) -> tuple[list[float], list[str]]:
    """Tick positions and local-time labels for a wall-time axis."""
    if last <= first:
        return [first], [time.strftime("%H:%M", time.localtime(first))]
    form = time_format(last - first)
    ticks = [first + (last - first) * i / count for i in range(count + 1)]
    return ticks, [time.strftime(form, time.localtime(t)) for t in ticks]


def step_label(step: float) -> str:
    """Round ticks short (50k), any other step exact (the first and the newest)."""
    if abs(step) >= 10_000 and step % 1000 == 0:
        return f"{step / 1000:.0f}k"
    if abs(step) >= 10_000 and step % 100 == 0:
        return f"{step / 1000:.1f}k"
    return f"{step:,.0f}" if abs(step) >= 10_000 else f"{step:.0f}"


def step_ticks(first: float, last: float, count: int = 5) -> tuple[list[float], list[str]]:
    """Round ticks for a step axis, the first step always among them (the run's start
    in view: step 1 of a six-day run stays readable at the left edge)."""
    span = last - first
    if span <= 0:
        return [first], [step_label(first)]
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    size = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    ticks = [first]
    tick = math.ceil(first / size) * size
    while tick <= last:
        if tick - first >= size / 2:  # not crowding the first label
            ticks.append(float(tick))
        tick += size
    if last - ticks[-1] >= size / 2:
        ticks.append(last)  # where "now" is
    return ticks, [step_label(t) for t in ticks]


def draw(
    widget: PlotextPlot,
    history: RunHistory,
    choice: PlotChoice,
    view: PlotView,
    *,
    width: int,
    log_scale: bool = False,
    smooth_only: bool = False,
    markers: bool = True,
) -> dict[str, SeriesView]:
    """Draw `choice` into `widget` (and refresh it); returns what was drawn, by series."""
    plt = widget.plt
    plt.clear_data()
    plt.clear_figure()
    since = history.since(view.span_s)
    drawn: dict[str, SeriesView] = {}
    xs_seen: list[float] = []
    for i, name in enumerate(series_names(history, choice)):
        series = history.view(name, since, width, by_time=view.by_time)
        if not series.xs:
            continue
        drawn[name] = series
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        label = series_label(choice, name, i)
        xs, ys = series.envelope()
        keep = [(x, y) for x, y in zip(xs, ys, strict=True) if not log_scale or y > 0]
        if not keep:
            continue
        xs_seen += [keep[0][0], series.last_x or keep[-1][0]]
        if not (smooth_only and choice.smoothed):
            plt.plot(
                [x for x, _ in keep],
                [_scaled(y, log_scale) for _, y in keep],
                marker="braille",
                color=colour,
                label=label,
            )
        if choice.smoothed:
            means = [(x, y) for x, y in zip(series.xs, series.means, strict=True)]
            means = [(x, y) for x, y in means if not log_scale or y > 0]
            if means:
                ys_smooth = smoothed([_scaled(y, log_scale) for _, y in means])
                plt.plot([x for x, _ in means], ys_smooth, marker="braille", color="orange")
    if xs_seen:
        first, last = min(xs_seen), max(xs_seen)
        if last > first:
            plt.xlim(first, last)
        if markers:  # each line costs plotext about as much as a series
            _draw_markers(widget, history.markers_in(since), first, last, view.by_time)
        plt.xticks(*(time_ticks(first, last) if view.by_time else step_ticks(first, last)))
    plt.xlabel("time" if view.by_time else choice.x_title)
    if log_scale:
        plt.ylabel(f"log10 {choice.title}")
    widget.refresh()
    return drawn


def series_label(choice: PlotChoice, name: str, i: int) -> str | None:
    """The legend's name of `choice`'s i-th series (None: the choice's title says it)."""
    if choice.labels and i < len(choice.labels):
        return choice.labels[i]
    if name.startswith("stage."):
        return name.removeprefix("stage.")
    return None


def _scaled(y: float, log_scale: bool) -> float:
    return math.log10(y) if log_scale else y


def _draw_markers(
    widget: PlotextPlot, markers: list[Marker], first: float, last: float, by_time: bool
) -> None:
    plt = widget.plt
    checkpoints = [m for m in markers if m.kind == "checkpoint"]
    every = max(1, math.ceil(len(checkpoints) / MAX_CHECKPOINT_LINES))
    shown = set(map(id, checkpoints[::every]))
    for marker in markers:
        if marker.kind == "checkpoint" and id(marker) not in shown:
            continue
        x = marker.t if by_time else marker.step
        if first <= x <= last:
            plt.vline(x, MARKER_COLOURS.get(marker.kind, "gray"))
