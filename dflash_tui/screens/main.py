"""The dashboard screen: its seven panes (keymap.PANES) and the keys that act on the run.
Every key's action opens its dialog here and hands the checked request to the app, which
talks to the Session."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from dflash_tui import keymap
from dflash_tui.screens.checkpoints_screen import CheckpointsScreen
from dflash_tui.screens.confirm import ConfirmDialog
from dflash_tui.screens.events_screen import EventsScreen
from dflash_tui.screens.help import HelpScreen
from dflash_tui.screens.launch_form import LaunchForm
from dflash_tui.screens.log_screen import LogScreen
from dflash_tui.screens.min_ready_prompt import MinReadyPrompt
from dflash_tui.screens.restart_dialog import RestartDialog, RestartRequest
from dflash_tui.screens.run_details import RunDetailsScreen
from dflash_tui.sources.advised_split import split_overrides
from dflash_tui.sources.run_history import RANGES
from dflash_tui.widgets.events_log import EventsLog
from dflash_tui.widgets.gpu_heatmap import GpuHeatmap
from dflash_tui.widgets.gpu_table import GpuTable
from dflash_tui.widgets.header import RunHeader
from dflash_tui.widgets.hs_queue import HsQueuePane
from dflash_tui.widgets.loss_plot import LossPane
from dflash_tui.widgets.metric_plot import PlotView
from dflash_tui.widgets.throughput_plot import ThroughputPane

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp

PANE_IDS = {name: f"pane-{name}" for name, _ in keymap.PANES}
# Rows of the body (all but header and footer) from which every pane has its full size;
# the rows the plot row keeps however short the terminal (its plot then has 8).
FULL_HEIGHT = 40
PLOT_ROWS = 11


class MainScreen(Screen[None]):
    BINDINGS = keymap.bindings()

    def __init__(self) -> None:
        super().__init__()
        # The range and x axis of every plot and of the GPU history.
        self.plot_view = PlotView()

    @property
    def console(self) -> DflashApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield RunHeader(id=PANE_IDS["header"])
        with Vertical(id="body"):
            with Horizontal(id="top-row"):
                yield GpuTable(id=PANE_IDS["gpus"], classes="pane")
                yield HsQueuePane(id=PANE_IDS["queue"], classes="pane")
            yield GpuHeatmap(id=PANE_IDS["heatmap"], classes="pane")
            with Horizontal(id="plot-row"):
                yield ThroughputPane(id=PANE_IDS["throughput"], classes="pane")
                yield LossPane(id=PANE_IDS["loss"], classes="pane")
            yield EventsLog(id=PANE_IDS["events"], classes="pane")
        yield Footer()

    def pane(self, name: str) -> Widget:
        return self.query_one(f"#{PANE_IDS[name]}")

    def on_resize(self, event: events.Resize) -> None:
        self.fit_height(event.size.height)

    def fit_height(self, height: int) -> None:
        """Lay the panes out by the terminal's height: below FULL_HEIGHT the GPU history
        gives way first, then the events pane and the top row shrink, so that the plots
        keep PLOT_ROWS rows (at 80x24 too). A pane the operator toggled keeps their choice."""
        body = height - 3  # the header's two rows and the footer's
        tall = body >= FULL_HEIGHT
        self.pane("heatmap").set_class(not tall, "gives-way")
        log_rows = 10 if body >= 34 else (6 if body >= 28 else 4)
        self.pane("events").styles.height = log_rows
        top = 14 if tall else max(5, body - PLOT_ROWS - log_rows)
        self.query_one("#top-row").styles.max_height = top

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Hidden from the footer and refused when pressed; the Session refuses too.
        return not (action in keymap.MUTATING_ACTIONS and self.console.read_only)

    # -- panes and view --------------------------------------------------------------

    def action_toggle_pane(self, name: str) -> None:
        pane = self.pane(name)
        pane.display = not pane.display
        self.console.request_redraw()

    def action_pause(self) -> None:
        self.console.paused = not self.console.paused
        self.console.request_redraw()

    def action_cycle_theme(self) -> None:
        self.console.cycle_theme()

    def action_toggle_log_scale(self) -> None:
        loss = self.query_one(LossPane)
        loss.log_scale = not loss.log_scale
        self.console.request_redraw()

    def action_toggle_smoothing(self) -> None:
        loss = self.query_one(LossPane)
        loss.smoothing = not loss.smoothing
        self.console.request_redraw()

    def action_logs(self) -> None:
        self.app.push_screen(LogScreen())

    def action_events(self) -> None:
        self.app.push_screen(EventsScreen())

    def action_reconnect(self) -> None:
        self.console.reconnect_now()

    def action_dismiss_alerts(self) -> None:
        self.console.dismiss_alerts()

    def action_cycle_metric(self) -> None:
        self.query_one(LossPane).cycle()
        self.console.request_redraw()

    def action_cycle_range(self) -> None:
        view = self.plot_view
        self.plot_view = PlotView((view.range_index + 1) % len(RANGES), view.by_time)
        self.console.request_redraw()

    def action_toggle_axis(self) -> None:
        self.plot_view = PlotView(self.plot_view.range_index, not self.plot_view.by_time)
        self.console.request_redraw()

    def action_toggle_heat(self) -> None:
        self.query_one(GpuHeatmap).toggle_value()
        self.console.request_redraw()

    def action_run_details(self) -> None:
        state = self.console.state
        self.app.push_screen(RunDetailsScreen(state.start, state.run_id))

    def action_checkpoints(self) -> None:
        state = self.console.state
        screen = CheckpointsScreen(state.checkpoints, state.heldout_scores, self.console.run_dir)
        self.app.push_screen(screen)
        self.run_worker(self._list_checkpoints(screen), group="status", name="checkpoints")

    async def _list_checkpoints(self, screen: CheckpointsScreen) -> None:
        """The box's own listing beside the stream's lines (pruned or partial ones too)."""
        try:
            reply = await self.console.session.status()
        except Exception as exc:  # shown in the screen, never raised
            screen.show_listing(None, f"dflash-train status failed: {exc}")
            return
        listed = reply.data.get("checkpoint_list") if reply.ok else None
        if isinstance(listed, list):
            screen.show_listing(listed, f"{len(listed)} on the box (dflash-train status)")
        elif reply.ok:
            screen.show_listing(None, "dflash-train status lists no checkpoints")
        else:
            screen.show_listing(None, f"dflash-train status: {reply.error}")

    def action_help(self) -> None:
        self.app.push_screen(
            HelpScreen(read_only=self.console.read_only, remapped=self.console.remapped_keys)
        )

    # -- run control -----------------------------------------------------------------

    def action_launch(self) -> None:
        # What the operator typed last comes back (after a cancel, or a launch the box
        # refused for one bad path) instead of the profile's defaults.
        defaults = {**self.console.launch_defaults(), **self.console.launch_draft}
        form = LaunchForm(defaults, target=self.console.target_name)

        def done(argv: list[str] | None) -> None:
            self.console.launch_draft = form.last_values
            self._confirm_launch(argv)

        self.app.push_screen(form, done)

    def _confirm_launch(self, argv: list[str] | None) -> None:
        if argv is None:
            return
        command = "launch" if argv[:1] == ["--prepare"] else "train"
        body = f"run dir {self.console.run_dir}\n\ndflash-train {command} {shlex.join(argv)}"

        def go(yes: bool | None) -> None:
            if yes:
                self.console.send_launch(argv)

        self.app.push_screen(ConfirmDialog("Launch this run?", body, yes_label="Launch"), go)

    def action_restart(self) -> None:
        # No overrides offered: the box keeps the live-set values itself (restart's
        # `carried`), so a plain restart changes nothing the operator did not ask for.
        self._open_restart()

    def action_restart_with_advice(self) -> None:
        state = self.console.state
        advice = state.split_advice
        if advice is None:
            self.console.toast(
                "no split advice from the trainer since the run (re)started", timeout=4
            )
            return
        try:
            overrides = split_overrides(state.topology, advice.targets, advice.drafters)
        except ValueError as exc:
            self.console.toast(f"split advice {advice.ratio}: {exc}", severity="warning")
            return
        self._open_restart(overrides)

    def _open_restart(self, overrides: str = "") -> None:
        dialog = RestartDialog(
            self.console.run_label(), self.console.live_settings(), overrides=overrides
        )

        def go(request: RestartRequest | None) -> None:
            if request is not None:
                self.console.send_restart(request)

        self.app.push_screen(dialog, go)

    def action_stop(self) -> None:
        body = (
            f"Stop run {self.console.run_label()} on {self.console.target_name}?\n"
            "The trainer finishes its step, writes a checkpoint and exits; "
            "it is killed only if it does not exit in time."
        )

        def go(yes: bool | None) -> None:
            if yes:
                self.console.send_stop()

        self.app.push_screen(ConfirmDialog("Stop the run", body, yes_label="Stop", danger=True), go)

    def action_min_ready(self) -> None:
        def go(value: int | None) -> None:
            if value is not None:
                self.console.send_min_ready(value)

        saved = self.console.options.remember is not None
        self.app.push_screen(
            MinReadyPrompt(self.console.live_settings(), saved_in_profile=saved), go
        )
