"""What a run directory says about its run: running, finished, stopped, crashed, stalled or
not started, judged from the run lock (liveness), the stream's tail and run.json."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.control.checkpoint_list import checkpoint_list
from dflash_train.rundir import RunDir, lock_holder_pid, lock_is_held, read_json
from dflash_train.stream.reader import StreamFacts, find_lines

DEFAULT_STALL_AFTER_S = 120.0
LOG_TAIL_LINES = 30
MODULES_PREFIX = "Extension modules: "  # the last line of a faulthandler report


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, *, since: int = 0) -> list[str]:
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            # Enough for `lines` lines of a traceback without reading a huge log.
            fh.seek(max(since, size - 512 * lines))
            data = fh.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    # A native crash's report (faulthandler: the training process installs it) lists the
    # innermost frame first, below its "Fatal Python error" line: read from that line, not
    # the end, which holds only the outermost frames and the extension modules. Only when
    # the report ends the log: one followed by another process's lines is an older crash.
    fatal = [i for i, line in enumerate(text) if line.startswith(protocol.FATAL_PREFIX)]
    if fatal:
        start = fatal[-1]
        end = next(
            (i for i in range(start, len(text)) if text[i].startswith(MODULES_PREFIX)),
            len(text),
        )
        if not any(line.strip() for line in text[end + 1 :]):
            return text[start : start + lines]
    return text[-lines:]


def newest_run_start(
    run_dir: RunDir, facts: StreamFacts | None = None
) -> protocol.StatusLine | None:
    """The newest run_start of the stream's run, else (a long run: its run_start lies
    before the tail that was read) the stream's first line when it is one."""
    facts = find_lines(run_dir.status, None) if facts is None else facts
    start = facts.run_start
    if start is None and facts.last is not None:
        with contextlib.suppress(FileNotFoundError), run_dir.status.open("rb") as fh:
            first = protocol.decode_line(fh.readline(protocol.MAX_LINE_BYTES))
            if isinstance(first, protocol.StatusLine) and first.run == facts.last.run:
                start = first if first.kind == "run_start" else None
    return start


def _total_steps(run_dir: RunDir, facts: StreamFacts) -> int | None:
    start = newest_run_start(run_dir, facts)
    total = start.get("total_steps") if start is not None else None
    return total if isinstance(total, int) else None


def run_status(
    run_dir: RunDir, *, stall_after_s: float = DEFAULT_STALL_AFTER_S, now: float | None = None
) -> dict[str, Any]:
    info = _run_status(run_dir, stall_after_s, time.time() if now is None else now)
    if lock_is_held(run_dir.restart_lock):
        # Between a restart's two trainers: the old one's stop is a pass, not the end.
        info["state"] = "restarting"
    return info


def _run_status(run_dir: RunDir, stall_after_s: float, now: float) -> dict[str, Any]:
    record = read_json(run_dir.run_json)
    record = record if isinstance(record, dict) else {}
    held = lock_is_held(run_dir.lock)
    facts = find_lines(run_dir.status, None)
    last = facts.last
    recorded_run = record.get("run_id")
    started_at = record.get("started_at")
    # The latest launch has written nothing yet when the stream's newest line is another
    # run's, or older than the launch.
    fresh_launch = isinstance(started_at, (int, float)) and (
        last is None or last.run != recorded_run or last.t < started_at
    )
    info: dict[str, Any] = {
        "run_dir": str(run_dir.root),
        "run_id": recorded_run if fresh_launch else (last.run if last else recorded_run),
        "pid": lock_holder_pid(run_dir.lock) if held else record.get("pid"),
        "last_seq": last.seq if last and not fresh_launch else None,
        "last_step": facts.step.get("step") if facts.step and not fresh_launch else None,
        "last_kind": last.kind if last and not fresh_launch else None,
        "last_line_age": round(now - last.t, 1) if last and not fresh_launch else None,
        "started_at": started_at,
        "launch": record.get("launch"),
        "total_steps": None if fresh_launch else _total_steps(run_dir, facts),
    }
    # Where this run's checkpoints are, and those (and exports) of earlier runs in the dir.
    info |= checkpoint_layout.run_layout(run_dir.root, info["run_id"])
    # Each of this run's checkpoints, complete or not, for the console's list.
    info["checkpoint_list"] = checkpoint_list(run_dir.root, info["run_id"])
    if held:
        since = started_at if fresh_launch else (last.t if last else started_at)
        quiet = now - since if isinstance(since, (int, float)) else 0.0
        info["state"] = "stalled" if quiet > stall_after_s else "running"
        # No step yet since its run_start (a run_start beyond the tail read is long past).
        info["starting"] = fresh_launch or (facts.run_start is not None and facts.step is None)
        info["quiet_s"] = round(quiet, 1)
        return info
    if last is None and not record:
        info["state"] = "not_started"
        return info
    if facts.run_end is not None and not fresh_launch:
        # A signal (`stop`, a restart's stop, a killed trainer's run_end written by stop)
        # is an operator's stop: resumable, not a completed run.
        reason = facts.run_end.get("reason")
        info["state"] = "stopped" if reason == "signal" else "finished"
        info["reason"] = reason
        info["exit_code"] = facts.run_end.get("exit_code")
        if facts.run_end.get("reason") == "error":
            info["error_tail"] = facts.run_end.get("error_tail")
            info["log_tail"] = log_tail(run_dir.log)
        return info
    info["state"] = "crashed"
    info["log_tail"] = log_tail(run_dir.log)
    return info
