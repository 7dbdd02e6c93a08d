"""The help screen (`?`): every key from the keymap with what it does; in watch mode the
mutating ones are listed as refused, and a key the config file's `[keys]` remapped says
which key it replaced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from dflash_tui.keymap import KEYMAP, shown_key


def keys_table(read_only: bool, remapped: Mapping[str, str] | None = None) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2))
    table.add_column("key", style="bold")
    table.add_column("what")
    for entry in KEYMAP:
        what = entry.help
        key = shown_key(entry, remapped)
        if key != shown_key(entry):
            # \\[ : a literal bracket in Rich markup
            what = f"{what} [italic](remapped in \\[keys]: was {shown_key(entry)})[/italic]"
        if entry.mutating and read_only:
            what = f"[dim]{what} — refused in watch mode[/dim]"
        table.add_row(key, what)
    table.add_row("ctrl+p", "command palette: every action and theme by name")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, *, read_only: bool, remapped: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.read_only = read_only
        self.remapped = dict(remapped or {})

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help-dialog"):
            yield Static("Keys", classes="dialog-title")
            yield Static(keys_table(self.read_only, self.remapped))
            yield Static("escape closes this screen", classes="form-hint")

    def action_close(self) -> None:
        self.dismiss(None)
