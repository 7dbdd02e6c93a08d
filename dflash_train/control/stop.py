"""Stop a run by its recorded process group: SIGTERM (the trainer checkpoints and writes
run_end), wait for the run lock to free, SIGKILL the group after the timeout. Never by
process name; liveness is the lock, never `kill -0`."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.rundir import LockHeld, RunDir, lock_holder_pid, lock_is_held, read_json
from dflash_train.stream.append import append_line
from dflash_train.stream.reader import find_lines, last_record

POLL_S = 0.1
KILL_WAIT_S = 15.0
KILLED_EXIT_CODE = 128 + signal.SIGKILL
# The lock frees before the interpreter and its CUDA contexts are gone; a restart's GPU
# preflight right after must not find the old trainer still on the GPU.
EXIT_WAIT_S = 20.0


def _wait_unlocked(run_dir: RunDir, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while lock_is_held(run_dir.lock):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _process_group(run_dir: RunDir, record: dict[str, Any]) -> tuple[int | None, int | None]:
    """(pid, pgid) of the lock holder: from run.json when it describes that process,
    else looked up from the pid the trainer wrote into run.lock."""
    holder = lock_holder_pid(run_dir.lock)
    pid, pgid = record.get("pid"), record.get("pgid")
    if isinstance(pid, int) and isinstance(pgid, int) and (holder is None or holder == pid):
        return pid, pgid
    if holder is None:
        return None, None
    try:
        return holder, os.getpgid(holder)
    except ProcessLookupError:
        return holder, None


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, read from /proc: a zombie has freed
    its memory and GPUs, and one nobody reaps would otherwise look alive forever."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def _wait_group_exited(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _mark_killed(run_dir: RunDir, run_id: str, waited: float) -> bool:
    """A killed trainer wrote no run_end: write one for it, now that its lock is free and
    nothing else writes the stream, so the run reads as stopped rather than crashed."""
    fields = {
        "reason": "signal",
        "exit_code": KILLED_EXIT_CODE,
        "stopped_by": "kill",
        "message": f"killed by dflash-train stop: no exit {waited:g} s after SIGTERM",
        **({"restarting": True} if lock_is_held(run_dir.restart_lock) else {}),
    }
    try:
        # Not if this start wrote nothing (a new stream would rotate the old one away) or
        # the stream already ends its run.
        return append_line(
            run_dir,
            "run_end",
            fields,
            onto=lambda last: last.run == run_id and last.kind != "run_end",
        )
    except LockHeld:  # a new trainer already holds the run: its stream is its own
        return False


def stop_run(run_dir: RunDir, *, timeout_s: float) -> protocol.Reply:
    if not lock_is_held(run_dir.lock):
        return protocol.reply_error(
            "stop", "not_running", f"run_dir: no trainer holds {run_dir.lock}"
        )
    record = read_json(run_dir.run_json)
    record = record if isinstance(record, dict) else {}
    pid, pgid = _process_group(run_dir, record)
    if pgid is None or pgid == os.getpgrp() or pgid <= 1:
        return protocol.reply_error(
            "stop",
            "no_process_group",
            f"run_dir: cannot tell the trainer's process group (pid {pid})",
        )
    last = last_record(run_dir.status)
    run_id = record.get("run_id") or (last.run if last is not None else None)
    before = last.seq if last is not None else -1
    started = time.monotonic()
    stopped_by = "term"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    if not _wait_unlocked(run_dir, timeout_s):
        stopped_by = "kill"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        if not _wait_unlocked(run_dir, KILL_WAIT_S):
            return protocol.reply_error(
                "stop",
                "stop_failed",
                f"pid {pid} still holds {run_dir.lock} {KILL_WAIT_S:g} s after SIGKILL",
                pid=pid,
                pgid=pgid,
            )
    exited = _wait_group_exited(pgid, EXIT_WAIT_S)
    waited = round(time.monotonic() - started, 2)
    facts = find_lines(run_dir.status, run_id, after_seq=before)
    end = facts.run_end
    if end is None and stopped_by == "kill" and run_id and _mark_killed(run_dir, run_id, waited):
        end = find_lines(run_dir.status, run_id, after_seq=before).run_end
    return protocol.reply_ok(
        "stop",
        run_id=run_id,
        pid=pid,
        pgid=pgid,
        stopped_by=stopped_by,
        seconds=waited,
        reason=end.get("reason") if end else None,
        exit_code=end.get("exit_code") if end else None,
        step=end.get("step") if end else None,
        exited=exited,
    )
