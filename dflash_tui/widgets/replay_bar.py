"""The replay's cursor line: where in the run the panes stand (line, seq, time, step) and
the keys that move it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static


@dataclass(frozen=True)
class CursorFacts:
    index: int  # 0-based line index; -1 while loading
    lines: int
    seq: int | None
    t: float | None
    kind: str | None
    step: int | None
    source: str


def render_cursor(facts: CursorFacts, colours: dict[str, str]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" ⏵ REPLAY ", style=f"bold reverse {colours['accent']}")
    if facts.index < 0:
        text.append(f" reading {facts.source} …", style="dim")
        return text
    when = "–" if facts.t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(facts.t))
    step = "–" if facts.step is None else f"{facts.step:,}"
    text.append(f" line {facts.index + 1:,}/{facts.lines:,}", style="bold")
    text.append(f" │ seq {facts.seq} │ {when} UTC │ {facts.kind} │ step {step} ")
    text.append("│ ←/→ step  [/] checkpoint·event  Home/End", style="dim")
    return text


class ReplayBar(Static):
    # Not docked: the footer docks at the bottom, and two docked bars would overlap.
    DEFAULT_CSS = "ReplayBar { height: 1; background: $panel; }"

    def show(self, facts: CursorFacts, colours: dict[str, str]) -> None:
        self.update(render_cursor(facts, colours), layout=False)
