"""A yes/no dialog that names exactly what will happen; used before launch and stop."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmDialog(ModalScreen[bool]):
    """Enter presses the focused button: the yes button for a dialog that asks for what the
    operator just asked for (a launch after filling its form), Cancel for a dangerous one
    (stop), so a stray Enter never stops a run. The hint line says which."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "no", "Cancel"),
        Binding("y", "yes", "Yes", show=False),
        Binding("n", "no", "No", show=False),
    ]

    def __init__(self, title: str, body: str, *, yes_label: str = "Yes", danger: bool = False):
        super().__init__()
        self.title_text = title
        self.body = body
        self.yes_label = yes_label
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog confirm-dialog"):
            yield Static(self.title_text, classes="dialog-title")
            yield Static(self.body, classes="dialog-body", markup=False)
            yield Static(self.hint(), classes="dialog-hint", markup=False)
            with Horizontal(classes="dialog-buttons"):
                variant = "error" if self.danger else "primary"
                yield Button(self.yes_label, id="yes", variant=variant)
                yield Button("Cancel", id="no")

    def hint(self) -> str:
        if self.danger:
            return f"y: {self.yes_label}   n, Esc or Enter: Cancel"
        return f"y or Enter: {self.yes_label}   n or Esc: Cancel"

    def on_mount(self) -> None:
        self.query_one("#no" if self.danger else "#yes", Button).focus()

    @on(Button.Pressed, "#yes")
    def action_yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#no")
    def action_no(self) -> None:
        self.dismiss(False)
