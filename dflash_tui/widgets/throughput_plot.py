"""The throughput pane: Ktok/s now and on average, and a plot of it over the steps."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui.widgets import units


class ThroughputPane(Vertical):
    BORDER_TITLE = "3 throughput"

    def compose(self) -> ComposeResult:
        yield Static("", classes="pane-summary")
        yield PlotextPlot()

    def show(self, points: Sequence[tuple[float, float]], now: float | None, avg: float | None):
        # One line whatever it says: no layout pass needed.
        self.query_one(".pane-summary", Static).update(
            f"Ktok/s now [b]{units.number(now)}[/b]   average [b]{units.number(avg)}[/b]",
            layout=False,
        )
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        if points:
            plt.plot([p[0] for p in points], [p[1] for p in points], marker="braille")
        plt.xlabel("step")
        plot.refresh()
