"""What a control command answered, in words: one human line for every reply (the box's
`message` where it sends one), and for a failure a modal with the reason, the facts worth
knowing and the log tail the box sent back. Nothing is shown as a Python repr."""

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
# Facts a person acts on, in this order; the rest of a reply is for programs.
FACT_KEYS = (
    "run_id", "pid", "exit_code", "state", "reason", "resumed_from", "run_dir", "seconds",
    "current", "settings", "env_dropped",
)  # fmt: skip


def reply_line(reply: Reply) -> str:
    """One line for the events pane and a toast."""
    message = reply.data.get("message")
    if isinstance(message, str) and message.strip():
        return " ".join(message.split())
    if reply.ok:
        return f"{reply.command}: done"
    return f"{reply.command} failed: {reply.error} [{reply.error_code}]"


def plain(value: Any) -> str:
    """A value as a person reads it: lists joined, mappings as `key=value`, none as '–'."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items()) or "–"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value) or "none"
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "…"


def describe_reply(reply: Reply) -> tuple[str, str, str]:
    """(headline, facts, log) in plain text."""
    headline = reply_line(reply) if reply.ok else f"{reply.command} failed: {reply.error}"
    facts = [f"{key.replace('_', ' ')}: {plain(reply.data[key])}" for key in FACT_KEYS
             if reply.data.get(key) not in (None, [], {}, "")]  # fmt: skip
    if not reply.ok and reply.error_code:
        facts.append(f"code: {reply.error_code}")
    return headline, "\n".join(facts), _log_text(reply.data)


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
