"""The throughput pane: Ktok/s now and on average, and its whole-run history raw and
smoothed (one step's rate jumps with its batch; the smoothed line shows the trend)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui.sources.run_history import SeriesView
from dflash_tui.sources.state import RunState
from dflash_tui.widgets import units
from dflash_tui.widgets.metric_plot import PLOTS, PlotView, draw

KTOK_S = next(choice for choice in PLOTS if choice.id == "ktok_s")


class ThroughputPane(Vertical):
    BORDER_TITLE = "3 throughput"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.drawn: dict[str, SeriesView] = {}

    def compose(self) -> ComposeResult:
        yield Static("", classes="pane-summary")
        yield PlotextPlot()

    def show(self, state: RunState, view: PlotView, width: int) -> None:
        now, avg = state.latest("ktok_s"), state.average_ktok_s()
        # One line whatever it says: no layout pass needed.
        self.query_one(".pane-summary", Static).update(
            f"Ktok/s now [b]{units.number(now)}[/b]   average [b]{units.number(avg)}[/b]   "
            f"[dim]{view.label()}[/dim]",
            layout=False,
        )
        # The markers are the metrics pane's: drawn twice they would double their cost.
        plot = self.query_one(PlotextPlot)
        self.drawn = draw(plot, state.history, KTOK_S, view, width=width, markers=False)
