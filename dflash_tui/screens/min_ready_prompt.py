"""The hs-min-ready prompt (`m`): shows the value in force and the allowed range, and only
closes with a value the protocol accepts against the current queue depth."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from dflash_train import protocol

KEY = "hs_min_ready"


def check_min_ready(text: str, current: Mapping[str, int]) -> int:
    return protocol.validate_settings({KEY: text}, current)[KEY]


class MinReadyPrompt(ModalScreen[int | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: Mapping[str, int], *, saved_in_profile: bool = False) -> None:
        super().__init__()
        self.current = {**protocol.DEFAULT_SETTINGS, **current}
        self.saved_in_profile = saved_in_profile

    def compose(self) -> ComposeResult:
        value, depth = self.current[KEY], self.current["hs_queue_depth"]
        with Vertical(classes="dialog min-ready-dialog"):
            yield Static("hs_min_ready", classes="dialog-title")
            yield Static(
                f"now {value}; allowed 1..{depth} (hs_queue_depth={depth}). " + self.outcome(),
                classes="dialog-body",
            )
            yield Input(str(value), id="value", type="text")
            yield Static("", id="value-error", classes="field-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Apply", id="submit", variant="primary")
                yield Button("Cancel", id="cancel")

    def outcome(self) -> str:
        """What happens to the value: the box keeps live values over a restart (restart's
        `carried`); a profile, when there is one, also keeps it for the next launch."""
        text = "Applied live; a restart of this run keeps it (the box carries it over)."
        if self.saved_in_profile:
            text += " Also saved in the profile, as the launch form's default."
        return text

    def show_error(self, message: str) -> None:
        error = self.query_one("#value-error", Static)
        error.update(message)
        error.set_class(bool(message), "shown")
        self.query_one("#value", Input).set_class(bool(message), "invalid")

    @on(Input.Changed, "#value")
    def _check(self, event: Input.Changed) -> None:
        try:
            check_min_ready(event.value, self.current)
        except protocol.SettingError as exc:
            self.show_error(str(exc))
        else:
            self.show_error("")

    @on(Input.Submitted, "#value")
    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        try:
            value = check_min_ready(self.query_one("#value", Input).value, self.current)
        except protocol.SettingError as exc:
            self.show_error(str(exc))
            return
        self.dismiss(value)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
