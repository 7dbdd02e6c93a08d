"""A full-screen view of many lines (train.log, the run's events): follows new lines while at
the end, `/` filters (plain text, or a regular expression after `re:`), `G`/`g` jump to
the end (and follow again) or the start, `Esc` or `q` goes back. Keeps a bounded number of
lines."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Input, Log, Static

from dflash_tui.sources.line_filter import FilterError, LineFilter

LINES_KEPT = 20_000


class LineViewer(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("G", "end", "End (follow)"),
        Binding("g", "start", "Start"),
        Binding("escape", "back", "Back"),
        Binding("q", "back", "Back", show=False),  # as in less and k9s: q leaves the view
    ]
    DEFAULT_CSS = """
    LineViewer #viewer-title { height: 1; background: $panel; padding: 0 1; }
    LineViewer #viewer-lines { height: 1fr; }
    LineViewer #viewer-filter { display: none; }
    LineViewer #viewer-filter.shown { display: block; }
    """
    title_text = "lines"

    def __init__(self, *, kept: int = LINES_KEPT) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=kept)
        self.filter = LineFilter()
        self.following = True
        self.problem = ""  # a refused filter, shown until the next good one
        self.status = ""  # what the subclass says about its source

    def compose(self) -> ComposeResult:
        yield Static(id="viewer-title", markup=False)
        yield Log(id="viewer-lines", max_lines=self.lines.maxlen, auto_scroll=True)
        yield Input(id="viewer-filter", placeholder="filter: text, or re:<regular expression>")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(Log).focus()
        self.show_title()

    @property
    def log_view(self) -> Log:
        return self.query_one("#viewer-lines", Log)

    # -- lines ---------------------------------------------------------------------------

    def add_lines(self, new: Iterable[str]) -> None:
        new = list(new)
        if not new:
            return
        self.lines.extend(new)
        shown = self.filter.select(new)
        if shown:
            self.log_view.write_lines(shown, scroll_end=self.following)
        self.show_title()

    def reset(self, lines: Iterable[str]) -> None:
        self.lines.clear()
        self.lines.extend(lines)
        self._redraw()

    def visible_lines(self) -> list[str]:
        return self.filter.select(self.lines)

    def _redraw(self) -> None:
        log = self.log_view
        log.clear()
        log.write_lines(self.visible_lines(), scroll_end=self.following)
        if not self.following:
            log.scroll_home(animate=False)
        self.show_title()

    def show_title(self) -> None:
        parts = [self.title_text, f"{len(self.lines):,} lines"]
        if self.filter.active:
            parts.append(f"{len(self.visible_lines()):,} match {self.filter.text!r}")
        parts.append("following" if self.following else "paused: G follows")
        if self.status:
            parts.append(self.status)
        if self.problem:
            # First, where a narrow terminal cannot cut it off.
            parts.insert(0, f"{self.problem} (the filter before it still applies)")
        self.query_one("#viewer-title", Static).update(" · ".join(parts))

    # -- keys ----------------------------------------------------------------------------

    def action_filter(self) -> None:
        field = self.query_one("#viewer-filter", Input)
        field.add_class("shown")
        field.focus()

    @on(Input.Changed, "#viewer-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        field = self.query_one("#viewer-filter", Input)
        try:
            self.filter = LineFilter.parse(event.value)
        except FilterError as exc:
            # The input stays as typed, marked, so it can be fixed rather than retyped.
            self.problem = str(exc)
            field.add_class("invalid")
            self.show_title()
            return
        self.problem = ""
        field.remove_class("invalid")
        self._redraw()

    @on(Input.Submitted, "#viewer-filter")
    def _filter_done(self) -> None:
        self._close_filter()

    def _close_filter(self) -> None:
        field = self.query_one("#viewer-filter", Input)
        if not field.value:
            field.remove_class("shown")
        self.log_view.focus()

    def action_end(self) -> None:
        self.following = True
        self.log_view.auto_scroll = True
        self.log_view.scroll_end(animate=False)
        self.show_title()

    def action_start(self) -> None:
        self.following = False
        self.log_view.auto_scroll = False
        self.log_view.scroll_home(animate=False)
        self.show_title()

    def action_back(self) -> None:
        if self.query_one("#viewer-filter", Input).has_focus:
            self._close_filter()
            return
        self.dismiss(None)
