"""The restart dialog (`R`): names the run, offers resume or fresh, and takes optional live
setting overrides as key=value words, checked with the protocol's own rules."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, RadioButton, RadioSet, Static

from dflash_train import protocol


@dataclass(frozen=True)
class RestartRequest:
    fresh: bool
    overrides: Mapping[str, str]


def parse_overrides(text: str, current: Mapping[str, int]) -> dict[str, str]:
    """`hs_min_ready=4 hs_queue_depth=16` -> {"hs_min_ready": "4", ...}; raises SettingError
    with a one-line reason naming the word or setting at fault."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise protocol.SettingError(f"overrides: cannot split: {exc}") from None
    updates: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise protocol.SettingError(f"overrides: {word!r} is not key=value")
        if key in updates:
            raise protocol.SettingError(f"{key}: given twice")
        updates[key] = value
    parsed = protocol.validate_settings(updates, current)
    return {key: str(value) for key, value in parsed.items()}


class RestartDialog(ModalScreen[RestartRequest | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, run_name: str, current: Mapping[str, int], *, overrides: str = "") -> None:
        super().__init__()
        self.run_name = run_name
        self.current = dict(current)
        self.overrides = overrides

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog restart-dialog"):
            yield Static(f"Restart run {self.run_name}?", classes="dialog-title", markup=False)
            with RadioSet(id="restart-mode"):
                yield RadioButton("resume from the newest checkpoint", value=True, id="resume")
                yield RadioButton("fresh: start again from step 0", id="fresh")
            yield Static("overrides (optional), e.g. hs_min_ready=4", classes="form-hint")
            yield Input(self.overrides, placeholder="key=value …", id="overrides")
            yield Static("", id="overrides-error", classes="field-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Restart", id="submit", variant="warning")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#overrides", Input).focus()

    def show_error(self, message: str) -> None:
        error = self.query_one("#overrides-error", Static)
        error.update(message)
        error.set_class(bool(message), "shown")
        self.query_one("#overrides", Input).set_class(bool(message), "invalid")

    @on(Input.Changed, "#overrides")
    def _check(self, event: Input.Changed) -> None:
        try:
            parse_overrides(event.value, self.current)
        except protocol.SettingError as exc:
            self.show_error(str(exc))
        else:
            self.show_error("")

    @on(Input.Submitted, "#overrides")
    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        try:
            overrides = parse_overrides(self.query_one("#overrides", Input).value, self.current)
        except protocol.SettingError as exc:
            self.show_error(str(exc))
            return
        fresh = self.query_one("#fresh", RadioButton).value
        self.dismiss(RestartRequest(fresh=fresh, overrides=overrides))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
