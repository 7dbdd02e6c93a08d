"""One prepare worker: `python -m dflash_train.data.prepare_worker WORK DEVICE NUMBER SHARE
DEADLINE CONFIG_JSON`. Loads its own target replica on DEVICE, then answers the chunk
numbers it reads on stdin, one a line, writing each chunk's part into the work dir, until
stdin closes. It speaks JSON lines on its stdout (ready, progress, done, error); everything
else it or its libraries print goes to stderr. It dies with its parent (PR_SET_PDEATHSIG),
so a killed prepare leaves no worker answering into the work dir."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

# Answer tokens are reported at most this often (one pipe write each).
REPORT_EVERY = 0.5


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _protocol_stream() -> TextIO:
    """The real stdout for our messages; fd 1 becomes stderr for everything else."""
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", buffering=1)


class PipeTally:
    """run_jobs' progress, forwarded to the coordinator."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tokens = 0
        self._pending = {"tokens": 0, "answers": 0, "truncated": 0}
        self._sent = 0.0

    def add_tokens(self, count: int) -> None:
        self.tokens += count
        self._pending["tokens"] += count
        self._maybe_send()

    def add_answers(self, count: int, truncated: int = 0) -> None:
        self._pending["answers"] += count
        self._pending["truncated"] += truncated
        self._maybe_send()

    def _maybe_send(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._sent >= REPORT_EVERY:
            if any(self._pending.values()):
                send(self.out, "progress", **self._pending)
            self._pending = dict.fromkeys(self._pending, 0)
            self._sent = now

    def flush(self) -> None:
        self._maybe_send(force=True)


def send(out: TextIO, event: str, **fields: Any) -> None:
    out.write(json.dumps({"event": event, **fields}) + "\n")
    out.flush()


def config_from_record(record: dict[str, Any]) -> Any:
    from dflash_train.config.prepare_config import PrepareConfig

    values = dict(record)
    values["out"] = Path(values["out"])
    if isinstance(values["prompts"], list):
        values["prompts"] = tuple(values["prompts"])
    return PrepareConfig(**values)


def main(argv: list[str]) -> int:
    _die_with_parent()
    out = _protocol_stream()
    work_root, device, number, share, deadline_text, record = argv
    from dflash_train.config.prepare_config import PrepareError
    from dflash_train.data.prepare_answers import (
        answer_chunk,
        cached_runner,
        load_prepare_target,
        sizing_for,
    )
    from dflash_train.data.prepare_work import WorkDir

    config = config_from_record(json.loads(record))
    deadline = None if deadline_text == "none" else float(deadline_text)
    began = time.monotonic()
    target = load_prepare_target(config, device)
    runner = cached_runner(target)
    sizing = sizing_for(device, config.batch_size, runner, int(share))
    send(out, "ready", rows=sizing.rows, load_s=round(time.monotonic() - began, 2))
    work = WorkDir(Path(work_root))
    tally = PipeTally(out)
    who = {"worker": int(number), "device": device}
    for line in sys.stdin:
        chunk = int(line)
        try:
            info = answer_chunk(work, chunk, target, runner, config, sizing, tally, deadline, who)
        except PrepareError as exc:
            tally.flush()
            send(out, "error", chunk=chunk, message=str(exc))
            return 2
        tally.flush()
        send(out, "done", chunk=chunk, samples=info["stats"]["samples"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
