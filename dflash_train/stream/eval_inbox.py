"""The run's eval inbox, `RUN_DIR/eval_inbox/`: an evaluation by hand
(control/eval_record.py) leaves its `eval` event there while a trainer lives, and the
trainer's monitor writes each into the stream, so the stream keeps one writer. One JSON
file an event, written atomically, taken (and deleted) once, oldest first."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from dflash_train.rundir import RunDir

INBOX = "eval_inbox"


def inbox_dir(run_dir: RunDir) -> Path:
    return run_dir.root / INBOX


class EvalInbox:
    """The trainer's side: the events left in the inbox, oldest first, each taken once."""

    def __init__(self, run_dir: RunDir) -> None:
        self.folder = inbox_dir(run_dir)

    def take(self) -> list[dict[str, Any]]:
        try:
            names = sorted(p for p in os.listdir(self.folder) if p.endswith(".json"))
        except FileNotFoundError:
            return []
        taken = []
        for name in names:
            path = self.folder / name
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                record = None
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if isinstance(record, dict) and record.get("code") == "eval":
                taken.append(record)
        return taken
