"""The events pane: control acks, checkpoints, warnings, console notes (replies, demo
progress), the count of rejected stream lines (those the box did not send for their size
apart), and the train.log tail when a run crashes."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from dflash_train.protocol import is_crash_report


@dataclass(frozen=True)
class EventEntry:
    t: float
    level: str  # info | warning | error
    text: str
    source: str = "run"  # run | console | alert


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def render_events(
    entries: Sequence[EventEntry],
    log_tail: Sequence[str],
    colours: Mapping[str, str],
    *,
    rows: int,
) -> Text:
    lines: list[Text] = []
    alert: Text | None = None  # the newest alert line: a crash's tail must not hide it
    for entry in entries:
        colour = {"warning": colours["warning"], "error": colours["error"]}.get(entry.level, "")
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(clock(entry.t) + " ", style="dim")
        mark = {"console": "» ", "alert": "! "}.get(entry.source, "· ")
        line.append(mark, style=colours["error"] if entry.source == "alert" else colours["accent"])
        line.append(entry.text, style=colour)
        lines.append(line)
        if entry.source == "alert":
            alert = line
    rows = max(rows, 1)
    if log_tail:
        # The tail takes the pane's lower part under its label, and leaves the upper rows
        # to the newest events, the alert among them.
        keep = min(len(log_tail), max(1, rows - 3))
        if is_crash_report(log_tail):
            # Its head says what killed the trainer, and where: innermost frame first.
            label = f"── train.log: crash report (first {keep} lines; L shows it all) ──"
            shown = log_tail[:keep]
        else:
            label = f"── train.log (last {keep} lines; L shows it all) ──"
            shown = log_tail[-keep:]
        tail = [Text(label, style=f"bold {colours['error']}")]
        tail += [Text(row, no_wrap=True, overflow="ellipsis") for row in shown]
        room = max(0, rows - len(tail))
        top = lines[-room:] if room else []
        if alert is not None and room and alert not in top:
            top = [alert, *top[1:]]
        lines = [*top, *tail]
    if not lines:
        return Text("no events yet", style="dim")
    return Text("\n", no_wrap=True, overflow="ellipsis").join(lines[-rows:])


class EventsLog(Static):
    BORDER_TITLE = "5 events"
    # One screen row per entry: a wrapped entry would push the newest out of the pane.
    DEFAULT_CSS = "EventsLog { text-wrap: nowrap; text-overflow: ellipsis; }"

    def show(
        self,
        entries: Sequence[EventEntry],
        log_tail: Sequence[str],
        colours: Mapping[str, str],
        rejected: int,
        oversized: int = 0,
    ) -> None:
        # Lines the box's tail did not send for their size are counted apart from the rest.
        split = f" ({rejected - oversized} malformed, {oversized} oversized)" if oversized else ""
        self.border_subtitle = f"rejected lines: {rejected}{split}" if rejected else ""
        # A fixed-height pane: its size never depends on the text.
        rows = self.content_size.height
        self.update(render_events(entries, log_tail, colours, rows=rows), layout=False)
