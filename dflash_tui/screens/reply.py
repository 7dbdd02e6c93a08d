"""Shows what a control command answered: success with its facts, or the failure reason
with the log tail the box sent back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from dflash_train.protocol import Reply

# Keys whose value is a block of log text rather than a fact to list.
LOG_KEYS = ("log_tail", "error_tail", "tail")


def describe_reply(reply: Reply) -> tuple[str, str, str]:
    """(headline, facts, log) in plain text."""
    if reply.ok:
        headline = f"{reply.command}: done"
    else:
        headline = f"{reply.command} failed: {reply.error} [{reply.error_code}]"
    facts = "\n".join(
        f"{key}: {_short(value)}" for key, value in reply.data.items() if key not in LOG_KEYS
    )
    return headline, facts, _log_text(reply.data)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "…"


def _log_text(data: Mapping[str, Any]) -> str:
    for key in LOG_KEYS:
        value = data.get(key)
        if isinstance(value, list):
            return "\n".join(str(v) for v in value)
        if isinstance(value, str) and value:
            return value
    return ""


class ReplyDialog(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,enter", "close", "Close")]

    def __init__(self, reply: Reply) -> None:
        super().__init__()
        self.reply = reply

    def compose(self) -> ComposeResult:
        headline, facts, log = describe_reply(self.reply)
        with Vertical(classes="dialog reply-dialog"):
            yield Static(
                headline,
                classes="dialog-title " + ("ok" if self.reply.ok else "failed"),
                markup=False,
            )
            if facts:
                yield Static(facts, classes="dialog-body", markup=False)
            if log:
                with VerticalScroll(classes="log-tail"):
                    yield Static(log, markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Close", id="close", variant="primary")

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(None)
