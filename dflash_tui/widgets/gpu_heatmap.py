"""The GPU history pane: a heatmap row per GPU (utilisation or power, `h` toggles) over the
plots' range, with its role and current numbers beside it, so a drafter starving at every
epoch's end or a target throttling at night shows at a glance."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import Static

from dflash_tui.sources.state import RunState
from dflash_tui.widgets.gpu_table import ROLE_LABELS
from dflash_tui.widgets.metric_plot import time_format

HEAT_VALUES = ("util", "power_w")
ROLE_WIDTH = 8
# Left: index and role; right: the current readings.
LEFT_WIDTH = 3 + 1 + ROLE_WIDTH + 1
RIGHT_WIDTH = 16
# Dark to bright (viridis): colour-blind safe and readable on dark and light themes.
RAMP = (
    "#440154", "#482878", "#3e4989", "#31688e", "#26828e",
    "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725",
)  # fmt: skip


def cell_colour(value: float, top: float) -> str:
    share = 0.0 if top <= 0 else max(0.0, min(1.0, value / top))
    return RAMP[min(len(RAMP) - 1, int(share * len(RAMP)))]


def _top(value: str, gpu: Mapping[str, Any]) -> float:
    if value == "util":
        return 100.0
    limit = gpu.get("power_limit_w")
    return float(limit) if isinstance(limit, (int, float)) and limit > 0 else 700.0


def render_heatmap(
    state: RunState, value: str, span_s: float | None, width: int, range_name: str
) -> Text:
    gpus: Sequence[Mapping[str, Any]] = state.gpus
    if not gpus:
        return Text("waiting for the first GPU reading…", style="dim")
    cells = max(4, width - LEFT_WIDTH - RIGHT_WIDTH - 2)
    lines = []
    first = last = None
    for gpu in gpus:
        index = gpu["index"]
        role = str(gpu.get("role") or "–")
        role = ROLE_LABELS.get(role, role)[:ROLE_WIDTH]
        view = state.gpu_view(index, value, span_s, cells)
        if view.xs:
            first = view.xs[0] if first is None else min(first, view.xs[0])
            last = view.last_x if last is None else max(last, view.last_x or last)
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{index:>3} {role:<{ROLE_WIDTH}} ")
        top = _top(value, gpu)
        # One span a run of equal colour: a span a cell made the pane cost more to draw
        # than both plots.
        colours = [cell_colour(mean, top) for mean in view.means]
        for colour, run in itertools.groupby(colours):
            line.append(" " * len(list(run)), style=f"on {colour}")
        line.append(" " * (cells - len(colours)))
        line.append(f" {_current(gpu)}")
        lines.append(line)
    lines.append(_axis(first, last, cells, range_name))
    return Text("\n").join(lines)


def _current(gpu: Mapping[str, Any]) -> str:
    util, power = gpu.get("util"), gpu.get("power_w")
    util_text = "   –" if util is None else f"{util:3.0f}%"
    power_text = "   –" if power is None else f"{power:4.0f} W"
    return f"{util_text} {power_text}"


def _axis(first: float | None, last: float | None, cells: int, range_name: str) -> Text:
    if first is None or last is None:
        return Text(" " * LEFT_WIDTH + range_name, style="dim")
    form = time_format(last - first)
    left = time.strftime(form, time.localtime(first))
    right = time.strftime(form, time.localtime(last))
    middle = f" {range_name} "
    gap = max(1, cells - len(left) - len(right) - len(middle))
    text = left + " " * (gap // 2) + middle + " " * (gap - gap // 2) + right
    return Text(" " * LEFT_WIDTH + text, style="dim", no_wrap=True)


class GpuHeatmap(Static):
    BORDER_TITLE = "7 GPU history"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.value = HEAT_VALUES[0]
        self.border_title = self._title()
        self._rows = -1

    def _title(self) -> str:
        return f"7 GPU history · {'power' if self.value == 'power_w' else 'util'} (h)"

    def toggle_value(self) -> str:
        self.value = HEAT_VALUES[(HEAT_VALUES.index(self.value) + 1) % len(HEAT_VALUES)]
        self.border_title = self._title()
        return self.value

    def show(self, state: RunState, span_s: float | None, range_name: str) -> None:
        width = max(self.content_size.width, 40)
        # A layout pass only when the pane's height can change (another GPU).
        rows = len(state.gpus)
        text = render_heatmap(state, self.value, span_s, width, range_name)
        self.update(text, layout=rows != self._rows)
        self._rows = rows
