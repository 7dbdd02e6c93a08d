"""The dashboard screen: the six panes and the keys that act on the run. Every key's action
opens its dialog here and hands the checked request to the app, which talks to the Session."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from dflash_tui import keymap
from dflash_tui.screens.confirm import ConfirmDialog
from dflash_tui.screens.events_screen import EventsScreen
from dflash_tui.screens.help import HelpScreen
from dflash_tui.screens.launch_form import LaunchForm
from dflash_tui.screens.log_screen import LogScreen
from dflash_tui.screens.min_ready_prompt import MinReadyPrompt
from dflash_tui.screens.restart_dialog import RestartDialog, RestartRequest
from dflash_tui.widgets.events_log import EventsLog
from dflash_tui.widgets.gpu_table import GpuTable
from dflash_tui.widgets.header import RunHeader
from dflash_tui.widgets.hs_queue import HsQueuePane
from dflash_tui.widgets.loss_plot import LossPane
from dflash_tui.widgets.throughput_plot import ThroughputPane

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp

PANE_IDS = {name: f"pane-{name}" for name, _ in keymap.PANES}


class MainScreen(Screen[None]):
    BINDINGS = keymap.bindings()

    @property
    def console(self) -> DflashApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield RunHeader(id=PANE_IDS["header"])
        with Vertical(id="body"):
            with Horizontal(id="top-row"):
                yield GpuTable(id=PANE_IDS["gpus"], classes="pane")
                yield HsQueuePane(id=PANE_IDS["queue"], classes="pane")
            with Horizontal(id="plot-row"):
                yield ThroughputPane(id=PANE_IDS["throughput"], classes="pane")
                yield LossPane(id=PANE_IDS["loss"], classes="pane")
            yield EventsLog(id=PANE_IDS["events"], classes="pane")
        yield Footer()

    def pane(self, name: str) -> Widget:
        return self.query_one(f"#{PANE_IDS[name]}")

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

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(read_only=self.console.read_only))

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
        body = f"run dir {self.console.run_dir}\n\ndflash-train train {shlex.join(argv)}"

        def go(yes: bool | None) -> None:
            if yes:
                self.console.send_launch(argv)

        self.app.push_screen(ConfirmDialog("Launch this run?", body, yes_label="Launch"), go)

    def action_restart(self) -> None:
        choice = self.console.min_ready_choice
        suggested = "" if choice is None else f"hs_min_ready={choice}"
        dialog = RestartDialog(
            self.console.run_label(), self.console.live_settings(), overrides=suggested
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

        self.app.push_screen(MinReadyPrompt(self.console.live_settings()), go)
