"""Redraws the dashboard's panes from cached state (RunState and the app's notes), each only
when its inputs changed: an unchanged pane would cost layout and paint for nothing."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from dflash_tui.sources.state import EventRecord, RunState
from dflash_tui.widgets.events_log import EventEntry, EventsLog
from dflash_tui.widgets.gpu_heatmap import GpuHeatmap
from dflash_tui.widgets.gpu_table import MAX_PROCESSES, GpuTable, render_gpus
from dflash_tui.widgets.header import HeaderFacts, RunHeader
from dflash_tui.widgets.hs_queue import HsQueuePane, render_queue
from dflash_tui.widgets.loss_plot import LossPane
from dflash_tui.widgets.prepare_pane import TITLE as PREPARE_TITLE
from dflash_tui.widgets.prepare_pane import render_prepare
from dflash_tui.widgets.throughput_plot import ThroughputPane

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp
    from dflash_tui.screens.main import MainScreen

# Plots cost the most to draw; they follow new data at most this often. The GPU and queue
# panes follow the trainer's monitor tick (about a second) at most once a second.
PLOT_EVERY_S = 2.0
READINGS_EVERY_S = 1.0


class PaneRefresh:
    def __init__(self) -> None:
        self._drawn: dict[str, object] = {}
        # When each throttled pane last drew, on the monotonic clock (the app's clock may
        # be frozen in tests; throttling must still pass).
        self._last: dict[str, float] = {}

    def invalidate(self) -> None:
        self._drawn.clear()
        self._last.clear()

    def due(self, pane: str, every: float) -> bool:
        return time.monotonic() - self._last.get(pane, -math.inf) >= every

    def drew(self, pane: str) -> None:
        self._last[pane] = time.monotonic()

    def changed(self, pane: str, signature: object) -> bool:
        """Whether `pane`'s inputs differ from what it last drew (and remember them)."""
        if self._drawn.get(pane) == signature:
            return False
        self._drawn[pane] = signature
        return True

    def frame_is_current(self, app: DflashApp) -> bool:
        """The plots and the GPU pane show the newest lines (the bench's 'complete frame')."""
        plots = self._drawn.get("plots", (None,))
        gpus = self._drawn.get("gpus", (None,))
        return plots[0] == app.seen["step"] and gpus[0] == app.seen["gpu"]  # type: ignore[index]

    def paint(self, app: DflashApp, main: MainScreen, now: float) -> None:
        colours = app.colours()
        state = app.state
        seen = app.seen
        theme = app.theme
        header = main.query_one(RunHeader)
        facts = header_facts(app, now)
        if header.display and self.changed("header", (facts, theme, header.size)):
            header.show(facts, colours)
        if app.paused:
            return
        readings_due = self.due("readings", READINGS_EVERY_S)
        gpus = main.query_one(GpuTable)
        signature = (seen["gpu"], theme, gpus.size)
        source = app.gpu_source.view(now).describe()
        if gpus.display and readings_due and self.changed("gpus-source", source):
            gpus.border_subtitle = source
        if gpus.display and readings_due and self.changed("gpus", signature):
            self.drew("readings")
            # Layout only when the pane's height can change: another GPU or process, or none.
            shape = (
                len(state.gpus),
                sum(min(len(g.get("processes") or ()), MAX_PROCESSES) for g in state.gpus),
                state.gpu_unavailable is None,
            )
            gpus.update(
                render_gpus(
                    state.gpus,
                    state.gpu_history,
                    colours,
                    unavailable=state.gpu_unavailable,
                    width=gpus.content_size.width,
                ),
                layout=self.changed("gpus-shape", shape),
            )
        queue = main.query_one(HsQueuePane)
        preparing = state.mode == "prepare"
        going = state.run_state == "preparing"  # an ended prepare's pane drops its ETA
        signature = (seen["queue"], seen["prepare"], preparing, going, theme, queue.size)
        if queue.display and readings_due and self.changed("queue", signature):
            self.drew("readings")
            width = queue.content_size.width
            # A prepare has no hidden-state queue: its progress takes the pane.
            shown = state.prepare if preparing else state.queue
            queue.border_title = PREPARE_TITLE if preparing else HsQueuePane.BORDER_TITLE
            queue.update(
                render_prepare(state.prepare, colours, width, going)
                if preparing
                else render_queue(state.queue, colours, width),
                layout=self.changed("queue-shape", (preparing, shown is None)),
            )
        events = main.query_one(EventsLog)
        rejected = sum(state.rejected_lines.values())
        oversized = state.rejected_lines.get("oversized", 0)
        latest_note = app.notes[-1] if app.notes else None
        signature = (
            seen["event"] + seen["checkpoint"] + seen["run_end"],
            latest_note,
            len(app.notes),
            len(app.log_tail),
            rejected,
            oversized,
            theme,
            events.size,
        )
        if events.display and self.changed("events", signature):
            events.show(event_entries(app), app.log_tail, colours, rejected, oversized)
        if self.due("plots", PLOT_EVERY_S):
            loss = main.query_one(LossPane)
            toggles = (loss.log_scale, loss.smoothing, loss.metric, main.plot_view)
            sizes = (main.query_one(ThroughputPane).size, loss.size)
            # Steps first: frame_is_current reads it. Profile, queue and event lines feed
            # the stage, starved and eval-tau plots, prepare lines a prepare's throughput;
            # markers come with starts and saves.
            kinds = ("profile", "queue", "event", "run_start", "checkpoint", "prepare")
            lines = sum(seen[k] for k in kinds)
            if self.changed("plots", (seen["step"], lines, toggles, sizes, theme)):
                self.drew("plots")
                draw_plots(app, main)
            heatmap = main.query_one(GpuHeatmap)
            signature = (seen["gpu"], heatmap.value, main.plot_view, heatmap.size, theme)
            if heatmap.display and self.changed("heatmap", signature):
                view = main.plot_view
                heatmap.show(state, view.span_s, view.range_name)


def draw_plots(app: DflashApp, main: MainScreen) -> None:
    state = app.state
    throughput = main.query_one(ThroughputPane)
    # A column a character: each draws its low and high (braille has two dots across),
    # and plotext's cost grows with the points it is given.
    if throughput.display:
        throughput.show(state, main.plot_view, max(throughput.content_size.width, 20))
    loss = main.query_one(LossPane)
    if loss.display:
        loss.show(state, main.plot_view, max(loss.content_size.width, 20))


def header_facts(app: DflashApp, now: float) -> HeaderFacts:
    state = app.state
    return HeaderFacts(
        target=app.target_name,
        run_dir=app.run_dir,
        run_id=state.run_id,
        badge=app.badge(),
        read_only=app.read_only,
        paused=app.paused,
        epoch=state.epoch,
        epochs=state.epochs,
        epoch_fraction=state.epoch_progress,
        step=state.step,
        total_steps=state.total_steps,
        eta_s=_prepare_eta(state) if state.mode == "prepare" else state.eta_s,
        age_s=state.last_line_age(now),
        updated_at=app.last_update_at(),
        wandb_url=app.wandb_url,
        heldout_tau=None if state.heldout is None else state.heldout.score,
        heldout_tf_only=state.heldout is not None and state.heldout.teacher_forced_only,
        heldout_step=None if state.heldout is None else state.heldout.step,
        preparing=state.mode == "prepare",
        prepare=_prepare_progress(state) if state.mode == "prepare" else None,
    )


def _prepare_progress(state: RunState) -> tuple[int, int, float] | None:
    line = state.prepare
    if line is None:
        return None
    return int(line["answers_done"]), int(line["answers_total"]), float(line["tokens_per_s"])


def _prepare_eta(state: RunState) -> float | None:
    """A prepare's time left, from its newest progress line; none once it is not going (a
    prepare cut by --max-seconds ends with answers left and its last line's ETA)."""
    if state.run_state != "preparing":
        return None
    eta = state.prepare.get("eta_s") if state.prepare is not None else None
    return float(eta) if isinstance(eta, (int, float)) else None


def event_entries(app: DflashApp) -> list[EventEntry]:
    from_run = [entry for record in app.state.events if (entry := run_event(record))]
    return sorted([*from_run, *app.notes], key=lambda e: e.t)


def run_event(record: EventRecord) -> EventEntry | None:
    """How a stream event reads in the events pane (None: not worth a row)."""
    if record.code == "history_end":
        return None
    plain = record.code in ("checkpoint", "run_end")
    return EventEntry(
        record.t, record.level, record.text if plain else f"{record.text} [{record.code}]"
    )
