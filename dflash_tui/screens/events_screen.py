"""Every event of the run and every console note, full screen, with the log view's filter
and scroll (the dashboard's pane shows only the newest few)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_tui.screens.line_viewer import LineViewer
from dflash_tui.widgets.events_log import EventEntry, clock

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp

POLL_S = 0.5


def event_line(entry: EventEntry) -> str:
    mark = {"console": "»", "alert": "!"}.get(entry.source, "·")
    return f"{clock(entry.t)} {mark} {entry.level:<7} {entry.text}"


class EventsScreen(LineViewer):
    title_text = "events"

    def __init__(self) -> None:
        super().__init__()
        self._shown: list[str] = []

    @property
    def console(self) -> DflashApp:
        return self.app  # type: ignore[return-value]

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_events()
        self.set_interval(POLL_S, self.refresh_events)

    def refresh_events(self) -> None:
        lines = [event_line(e) for e in self.console.event_entries()]
        if lines == self._shown:
            return
        if lines[: len(self._shown)] == self._shown:
            self.add_lines(lines[len(self._shown) :])
        else:  # a note replaced in place, or old events dropped: draw again
            self.reset(lines)
        self._shown = lines
