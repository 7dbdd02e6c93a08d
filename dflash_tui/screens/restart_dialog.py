"""The restart dialog (`R`): names the run, offers resume or fresh, and takes optional
overrides of any train option as key=value words, checked with the trainer's own rules
(restart_overrides.py) before anything is sent. A fresh start
abandons the run's training state, so (as k9s does for destructive actions) it is sent only
once the run id or the word "fresh" has been typed."""

from __future__ import annotations

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
from dflash_tui.screens.restart_overrides import parse_overrides

__all__ = ["RestartDialog", "RestartRequest", "parse_overrides"]


@dataclass(frozen=True)
class RestartRequest:
    fresh: bool
    overrides: Mapping[str, str]


FRESH_WORD = "fresh"


def run_id_of(run_name: str) -> str | None:
    """The run id at the front of the console's run label ("<id> in <dir>"), if it has one."""
    head = run_name.split(" in ", 1)[0].strip()
    return None if not head or head.startswith("(") else head


def fresh_confirmed(typed: str, run_id: str | None) -> bool:
    word = typed.strip()
    return word == FRESH_WORD or (run_id is not None and word == run_id)


class RestartDialog(ModalScreen[RestartRequest | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    RestartDialog #fresh-confirm-box { height: auto; display: none; }
    RestartDialog #fresh-confirm-box.shown { display: block; }
    """

    def __init__(self, run_name: str, current: Mapping[str, int], *, overrides: str = "") -> None:
        super().__init__()
        self.run_name = run_name
        self.run_id = run_id_of(run_name)
        self.current = dict(current)
        self.overrides = overrides

    def _confirm_hint(self) -> str:
        words = f'"{self.run_id}" or "{FRESH_WORD}"' if self.run_id else f'"{FRESH_WORD}"'
        return (
            "A fresh start does not resume this run: a new run id starts at step 0. The old "
            "run's checkpoints and export are kept (dflash-train status names where).\n"
            f"Type {words} to confirm:"
        )

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog restart-dialog"):
            yield Static(f"Restart run {self.run_name}?", classes="dialog-title", markup=False)
            with RadioSet(id="restart-mode"):
                yield RadioButton("resume from the newest checkpoint", value=True, id="resume")
                yield RadioButton("fresh: start again from step 0", id="fresh")
            yield Static(
                "overrides (optional), any train option: e.g. epochs=8 lr=1e-4 hs_min_ready=4; "
                "live values set with m are kept unless an override names them",
                classes="form-hint",
            )
            yield Input(self.overrides, placeholder="key=value …", id="overrides")
            yield Static("", id="overrides-error", classes="field-error")
            with Vertical(id="fresh-confirm-box"):
                yield Static(self._confirm_hint(), classes="form-hint", markup=False)
                yield Input(placeholder=self.run_id or FRESH_WORD, id="fresh-confirm")
                yield Static("", id="fresh-confirm-error", classes="field-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Restart", id="submit", variant="warning")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#overrides", Input).focus()

    def show_error(self, message: str, field: str = "overrides") -> None:
        error = self.query_one(f"#{field}-error", Static)
        error.update(message)
        error.set_class(bool(message), "shown")
        self.query_one(f"#{field}", Input).set_class(bool(message), "invalid")

    @on(RadioSet.Changed, "#restart-mode")
    def _mode_changed(self) -> None:
        fresh = self.query_one("#fresh", RadioButton).value
        self.query_one("#fresh-confirm-box").set_class(fresh, "shown")
        if not fresh:
            self.query_one("#fresh-confirm", Input).value = ""
            self.show_error("", "fresh-confirm")

    @on(Input.Changed, "#overrides")
    def _check(self, event: Input.Changed) -> None:
        try:
            parse_overrides(event.value, self.current)
        except protocol.SettingError as exc:
            self.show_error(str(exc))
        else:
            self.show_error("")

    @on(Input.Submitted, "#overrides")
    @on(Input.Submitted, "#fresh-confirm")
    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        try:
            overrides = parse_overrides(self.query_one("#overrides", Input).value, self.current)
        except protocol.SettingError as exc:
            self.show_error(str(exc))
            return
        fresh = self.query_one("#fresh", RadioButton).value
        if fresh:
            confirm = self.query_one("#fresh-confirm", Input)
            if not fresh_confirmed(confirm.value, self.run_id):
                words = f"{self.run_id!r} or {FRESH_WORD!r}" if self.run_id else repr(FRESH_WORD)
                self.show_error(f"confirm: type {words} to start fresh", "fresh-confirm")
                confirm.focus()
                return
        self.dismiss(RestartRequest(fresh=fresh, overrides=overrides))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
