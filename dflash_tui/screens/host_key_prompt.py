"""Asks whether to trust a host whose key is not in known_hosts, showing its fingerprint;
nothing is written unless the operator says yes. Keys as in ConfirmDialog's dangerous form
(seen in tmux: `y` did nothing and nothing said which button had the focus): `y` trusts;
`n`, Esc and Enter (Refuse has the focus) refuse."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class HostKeyPrompt(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "refuse", "Refuse"),
        Binding("y", "trust", "Trust", show=False),
        Binding("n", "refuse", "Refuse", show=False),
    ]
    HINT = "y: Trust and connect   n, Esc or Enter: Refuse"

    def __init__(self, host: str, port: int, fingerprint: str) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.fingerprint = fingerprint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog host-key-dialog"):
            yield Static(f"Unknown host {self.host}:{self.port}", classes="dialog-title")
            yield Static(
                "Its key is not in known_hosts. Compare this fingerprint with the one the "
                f"box shows (ssh-keygen -lf /etc/ssh/ssh_host_*.pub):\n\n  {self.fingerprint}\n\n"
                "Trust it and add it to known_hosts?",
                classes="dialog-body",
                markup=False,
            )
            yield Static(self.HINT, classes="dialog-hint", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Trust and connect", id="trust", variant="warning")
                yield Button("Refuse", id="refuse")

    def on_mount(self) -> None:
        self.query_one("#refuse", Button).focus()

    @on(Button.Pressed, "#trust")
    def action_trust(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#refuse")
    def action_refuse(self) -> None:
        self.dismiss(False)
