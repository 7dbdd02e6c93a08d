"""Messages that I/O workers post to the app, so the UI changes only in handlers."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from dflash_train.protocol import Reply


@dataclass
class Note(Message):
    """A line for the events pane from the console itself (a reply, demo progress, an error)."""

    level: str
    text: str
    # Notes with the same key replace each other (a progress line updated in place).
    key: str | None = None


@dataclass
class ControlDone(Message):
    """A control command came back; `reply` is None when it could not be sent at all."""

    command: str
    reply: Reply | None
    problem: str | None = None


@dataclass
class LogTail(Message):
    """The train.log tail `status` returned for a crashed run."""

    run_id: str | None
    lines: list[str]
