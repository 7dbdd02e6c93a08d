"""The dashboard of a finished run, with a time cursor: the live console's screen and panes,
drawn from the RunState at the cursor (sources/replay.py). Every control key is hidden, says
"replay is read-only" when pressed, and the session under it refuses control calls."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer

from dflash_tui import keymap
from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.screens.main import MainScreen
from dflash_tui.sources.replay import ReplayClock, ReplayError, ReplaySession, Timeline
from dflash_tui.sources.session import Session
from dflash_tui.sources.transport import HostKeyUnknown, Transport, TransportError
from dflash_tui.widgets.replay_bar import CursorFacts, ReplayBar

# The keys of the actions a replay refuses (the control keys of the dashboard).
READ_ONLY_KEYS = frozenset(k.key for k in keymap.KEYMAP if k.mutating)


class ReplayApp(DflashApp):
    TITLE = "dflash replay"
    # Priority: a focused pane must not swallow the cursor keys.
    BINDINGS = [  # noqa: RUF012 - Textual's own declaration style
        Binding("left", "move('step', -1)", "◀ step", priority=True, id="replay.back"),
        Binding("right", "move('step', 1)", "step ▶", priority=True, id="replay.forward"),
        Binding("[", "move('mark', -1)", "◀ mark", priority=True, id="replay.mark_back"),
        Binding("]", "move('mark', 1)", "mark ▶", priority=True, id="replay.mark_forward"),
        Binding("home", "move('start', -1)", "first", priority=True, id="replay.start"),
        Binding("end", "move('end', 1)", "last", priority=True, id="replay.end"),
    ]

    def __init__(
        self,
        transport: Transport,
        options: ConsoleOptions,
        *,
        stream_file: Path | None = None,
        stream_name: str | None = None,
        source: str = "",
    ) -> None:
        self.stream_file = stream_file
        self.stream_name = stream_name
        self.source = source or str(stream_file or options.run_dir)
        self.timeline: Timeline | None = None
        clock = ReplayClock()
        # Whatever the caller asked: a replay only watches.
        options = replace(options, read_only=True, follow_gpus=False)
        super().__init__(transport, options, clock=clock)
        self.replay_clock = clock

    def _make_session(self) -> Session:
        return ReplaySession(
            self.transport,
            run_dir=self.options.run_dir,
            stream_file=self.stream_file,
            stream_name=self.stream_name,
            python=self.options.python,
            on_line=self._on_line,
        )

    @work(group="stream", exclusive=True, name="follow")
    async def connect_and_follow(self) -> None:
        assert isinstance(self.session, ReplaySession)
        self.connection = "connecting"
        try:
            raws = await self.session.load()
            # A six-day run is a quarter of a million lines: walk them off the UI's loop.
            timeline = await asyncio.to_thread(Timeline, raws, clock=self.replay_clock)
        except HostKeyUnknown as exc:
            self.connection = "failed"
            self.note("error", f"replay: {exc}")
            self.call_later(self.offer_host_key, exc)
            return
        except (ReplayError, TransportError) as exc:
            self.connection = "failed"
            self.note("error", f"replay: {exc}")
            return
        self.timeline = timeline
        self.connection = "connected"
        self.seek(timeline.end)

    # -- the cursor ------------------------------------------------------------------

    def seek(self, index: int) -> None:
        timeline = self.timeline
        if timeline is None:
            return
        self.state = timeline.seek(index)
        self.seen["replay"] += 1
        self.request_redraw()

    def action_move(self, how: str, direction: int) -> None:
        timeline = self.timeline
        if timeline is None:
            return
        if how == "step":
            target = timeline.next_step(direction)
        elif how == "mark":
            target = timeline.next_mark(direction)
        else:
            target = 0 if direction < 0 else timeline.end
        self.seek(target)

    def cursor_facts(self) -> CursorFacts:
        timeline = self.timeline
        if timeline is None or timeline.position < 0:
            return CursorFacts(-1, 0, None, None, None, None, self.source)
        i = timeline.position
        return CursorFacts(
            i,
            len(timeline),
            timeline.seq(i),
            timeline.time(i),
            timeline.kind(i),
            self.state.step,
            self.source,
        )

    # -- what differs from a live console ----------------------------------------------

    def on_key(self, event: events.Key) -> None:
        # A control key does nothing in a replay (its binding is refused): say why.
        if event.key in READ_ONLY_KEYS:
            self.toast("replay is read-only: it cannot launch, stop, restart or set", timeout=4)

    def last_update_at(self) -> float | None:
        """The run's own time at the cursor: 'N s ago' would be measured from the cursor."""
        timeline = self.timeline
        if timeline is None or timeline.position < 0:
            return None
        return timeline.time(timeline.position)

    def badge(self) -> str:
        if self.timeline is None:
            return "failed" if self.connection == "failed" else "loading"
        return self.state.run_state

    def maybe_check_status(self, now: float) -> None:
        return None  # the box's present state says nothing about a moment of the past

    def make_main_screen(self) -> MainScreen:
        return ReplayScreen()

    def redraw(self) -> None:
        main = self.main_screen()
        # Before the screen has composed (or once it is torn down) there is no bar to paint.
        bars = main.query(ReplayBar) if main is not None else ()
        if bars:
            bars.first().show(self.cursor_facts(), self.colours())
        super().redraw()


class ReplayScreen(MainScreen):
    """The live dashboard with the cursor's bar above the footer. Composed with the screen:
    a bar mounted later by a redraw raced the screen's own compose (no Footer yet)."""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, Footer):
                yield ReplayBar()
            yield widget

    def fit_height(self, height: int) -> None:
        super().fit_height(height - 1)  # the bar's row
