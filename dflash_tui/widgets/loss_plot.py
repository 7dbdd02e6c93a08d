"""The loss pane: loss over the steps (log scale and smoothing toggles keep days of training
readable), with the latest accuracy and expected acceptance length tau."""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui.widgets import units

SMOOTHING_WINDOW = 9


def smoothed(values: Sequence[float], window: int = SMOOTHING_WINDOW) -> list[float]:
    """Centred moving average; the ends use the points they have."""
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half) : i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


class LossPane(Vertical):
    BORDER_TITLE = "4 loss"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.log_scale = False
        self.smoothing = False

    def compose(self) -> ComposeResult:
        yield Static("", classes="pane-summary")
        yield PlotextPlot()

    def show(
        self,
        points: Sequence[tuple[float, float]],
        loss: float | None,
        acc: float | None,
        tau: float | None,
    ) -> None:
        modes = [name for name, on in (("log", self.log_scale), ("smooth", self.smoothing)) if on]
        summary = (
            f"loss [b]{units.number(loss)}[/b]   acc [b]{units.percent(acc)}[/b]   "
            f"tau [b]{units.number(tau)}[/b]"
            + (f"   [dim]({', '.join(modes)})[/dim]" if modes else "")
        )
        # One line whatever it says: no layout pass needed.
        self.query_one(".pane-summary", Static).update(summary, layout=False)
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        # A log axis cannot show zero or negative values; keep only what it can draw.
        usable = [p for p in points if p[1] > 0] if self.log_scale else list(points)
        if usable:
            ys = [p[1] for p in usable]
            if self.smoothing:
                ys = smoothed(ys)
            if self.log_scale:
                ys = [math.log10(y) for y in ys]
            plt.plot([p[0] for p in usable], ys, marker="braille")
        plt.xlabel("step")
        if self.log_scale:
            plt.ylabel("log10 loss")
        plot.refresh()
