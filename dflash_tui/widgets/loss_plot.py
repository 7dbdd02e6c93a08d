"""The metrics pane: one metric's whole-run history at a time, cycled with `v` (loss, accuracy,
tau, grad norm, learning rate, Ktok/s, stage times, drafter starved), over the range and x
axis chosen with `z` and `x`; log scale and smoothed-only toggles keep days readable."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui.sources.bucket_level import SeriesView
from dflash_tui.sources.state import RunState
from dflash_tui.widgets import units
from dflash_tui.widgets.metric_plot import (
    PLOTS,
    PlotChoice,
    PlotView,
    draw,
    series_label,
    series_names,
)

PANE_NUMBER = "4"


class LossPane(Vertical):
    BORDER_TITLE = f"{PANE_NUMBER} loss"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.log_scale = False
        self.smoothing = False  # smoothed line only, the raw one hidden
        self.metric = 0
        self.drawn: dict[str, SeriesView] = {}  # what the plot shows now, by series

    def compose(self) -> ComposeResult:
        yield Static("", classes="pane-summary")
        yield PlotextPlot()

    @property
    def choice(self) -> PlotChoice:
        return PLOTS[self.metric]

    def cycle(self) -> PlotChoice:
        self.metric = (self.metric + 1) % len(PLOTS)
        self.border_title = f"{PANE_NUMBER} {self.choice.title}"
        return self.choice

    def show(self, state: RunState, view: PlotView, width: int) -> None:
        choice = self.choice
        plot = self.query_one(PlotextPlot)
        self.drawn = draw(
            plot,
            state.history,
            choice,
            view,
            width=width,
            log_scale=self.log_scale,
            smooth_only=self.smoothing,
        )
        modes = [name for name, on in (("log", self.log_scale), ("smooth", self.smoothing)) if on]
        if state.mode == "prepare":
            text = preparing_note(state)
        elif choice.id == "loss":
            text = (
                f"loss [b]{units.number(state.latest('loss'))}[/b]   "
                f"acc [b]{units.percent(state.latest('acc'))}[/b]   "
                f"tau [b]{units.number(state.latest('tau'))}[/b]"
            )
        else:
            text = (
                "   ".join(
                    f"{series_label(choice, name, i) or name} "
                    f"[b]{units.number(_newest(state, name))}[/b]"
                    for i, name in enumerate(series_names(state.history, choice))
                )
                or f"{choice.title}: [dim]nothing recorded yet[/dim]"
            )
            if choice.id == "tau" and state.heldout is None:
                text += "   [dim](no held-out evaluation yet)[/dim]"
        tail = f"   [dim]({', '.join(modes)})[/dim]" if modes else ""
        tail += f"   [dim]{view.label()}[/dim]"
        if choice.id == "tau" and state.heldout is not None:
            text += self._first_kept(text, tail, state.heldout.first_kept)
        # One line whatever it says: no layout pass needed.
        self.query_one(".pane-summary", Static).update(text + tail, layout=False)

    def _first_kept(self, text: str, tail: str, first_kept: float | None) -> str:
        """Where held-out tau comes from: the share of its decoding rounds that kept the first
        draft. Said only where the line has room for it and the modes and range after it."""
        if first_kept is None:
            return ""
        extra = f"   1st draft kept [b]{units.percent(first_kept)}[/b]"
        fits = Text.from_markup(text + extra + tail).cell_len <= self.content_size.width
        return extra if fits else ""


PREPARE_THEN_TRAIN = "preparing data: the training starts when every answer is written"
PREPARE_ONLY = "preparing data only: no training follows (launch one on its --out when done)"


def preparing_note(state: RunState) -> str:
    """What the metrics pane says while a launched prepare runs: it has no training metric
    yet, and whether one will come in this run (`launch --prepare` with train args)."""
    then_train = bool(state.config.get("then_train")) if state.config else False
    return f"[dim]{PREPARE_THEN_TRAIN if then_train else PREPARE_ONLY}[/dim]"


def _newest(state: RunState, name: str) -> float | None:
    series = state.history.series.get(name)
    return None if series is None else series.last
