"""The throughput pane: Ktok/s now and on average, and its whole-run history raw and
smoothed (one step's rate jumps with its batch; the smoothed line shows the trend). While a
launched prepare runs: its answer tokens/s, now (between its last two progress lines) and
on average, against the answer tokens made."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui.sources.bucket_level import SeriesView
from dflash_tui.sources.state import RunState
from dflash_tui.widgets import units
from dflash_tui.widgets.metric_plot import PLOTS, PREPARE_TOK_S, PlotView, draw

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
        if state.mode == "prepare":
            line = state.prepare
            now = units.token_rate(state.prepare_rate) if line is not None else "–"
            avg = units.token_rate(line["tokens_per_s"]) if line is not None else "–"
            summary = f"answer tok/s now [b]{now}[/b]   average [b]{avg}[/b]"
            choice, counted = PREPARE_TOK_S, "answer tokens"
        else:
            now_k, avg_k = state.latest("ktok_s"), state.average_ktok_s()
            summary = (
                f"Ktok/s now [b]{units.number(now_k)}[/b]   average [b]{units.number(avg_k)}[/b]"
            )
            choice, counted = KTOK_S, "steps"
        # One line whatever it says: no layout pass needed.
        self.query_one(".pane-summary", Static).update(
            f"{summary}   [dim]{view.label(counted)}[/dim]", layout=False
        )
        # The markers are the metrics pane's: drawn twice they would double their cost.
        plot = self.query_one(PlotextPlot)
        self.drawn = draw(plot, state.history, choice, view, width=width, markers=False)
