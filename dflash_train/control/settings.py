"""Live settings: find the values in force, and change one through control.json and wait
for the trainer's answer."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from dflash_train import protocol
from dflash_train.rundir import RunDir, atomic_write_text, lock_is_held
from dflash_train.stream.follower import StreamFollower
from dflash_train.stream.reader import last_record, read_envelope, tail_lines

POLL_S = 0.2
ANSWERS = ("control_applied", "control_rejected")


def settings_in_force(run_dir: RunDir) -> dict[str, int]:
    """The newest values the stream reports (see `reported_settings`), the defaults for
    what it does not."""
    _, found = reported_settings(run_dir)
    return {**protocol.DEFAULT_SETTINGS, **found}


def reported_settings(run_dir: RunDir) -> tuple[str | None, dict[str, int]]:
    """(run id, values) of the newest live settings the stream's last run reports: a queue
    line, an applied control change, or run_start's settings, whichever comes last; no
    values when it reports none."""
    run: str | None = None
    for raw in reversed(tail_lines(run_dir.status, 1 << 20)):
        env = read_envelope(raw)
        if env is None or env.kind not in ("queue", "event", "run_start"):
            continue
        run = run or env.run
        if env.run != run:
            break
        line = protocol.decode_line(raw)
        if not isinstance(line, protocol.StatusLine):
            continue
        if env.kind == "queue":
            values = {k: line.get(k) for k in protocol.LIVE_SETTINGS}
        elif env.kind == "run_start" or line.get("code") == "control_applied":
            values = line.get("settings") or {}
        else:
            continue
        found = {k: v for k, v in values.items() if k in protocol.LIVE_SETTINGS}
        found = {k: v for k, v in found.items() if type(v) is int}
        if found:
            return run, found
    return run, {}


def _answer(follower: StreamFollower, rev: int) -> protocol.StatusLine | None:
    for raw in follower.poll():
        env = read_envelope(raw)
        if env is None or env.kind != "event":
            continue
        line = protocol.decode_line(raw)
        if (
            isinstance(line, protocol.StatusLine)
            and line.get("code") in ANSWERS
            and line.get("rev") == rev
        ):
            return line
    return None


def _current_rev(run_dir: RunDir) -> int:
    """The highest revision the trainer may have seen. A new change must go above it or the
    trainer ignores it, so an invalid control.json still counts with its rev, and the
    revisions the stream answered count too (the file may be unreadable junk by now)."""
    revs = [0]
    try:
        obj = json.loads(run_dir.control.read_text(encoding="utf-8"))
    except (FileNotFoundError, UnicodeDecodeError, ValueError):
        obj = None
    if isinstance(obj, dict) and type(obj.get("rev")) is int:
        revs.append(obj["rev"])
    for raw in reversed(tail_lines(run_dir.status, 1 << 20)):
        env = read_envelope(raw)
        if env is None or env.kind != "event":
            continue
        line = protocol.decode_line(raw)
        if isinstance(line, protocol.StatusLine) and line.get("code") in ANSWERS:
            rev = line.get("rev")
            if type(rev) is int:
                revs.append(rev)
                break
    return max(revs)


def set_setting(run_dir: RunDir, key: str, raw_value: str, *, wait_s: float) -> protocol.Reply:
    """Validate, write control.json atomically with the next rev, wait for the answer.
    The caller holds `control_guard`, so two changes cannot take the same rev."""
    try:
        value = protocol.parse_setting_value(key, raw_value)
    except protocol.SettingError as exc:
        code = "unknown_setting" if key not in protocol.LIVE_SETTINGS else "bad_value"
        return protocol.reply_error("set", code, str(exc))
    if not lock_is_held(run_dir.lock):
        return protocol.reply_error(
            "set", "not_running", f"run_dir: no trainer holds {run_dir.lock}"
        )
    current = settings_in_force(run_dir)
    try:
        protocol.validate_settings({key: value}, current)
    except protocol.SettingError as exc:
        return protocol.reply_error("set", "out_of_range", str(exc), current=current)
    last = last_record(run_dir.status)
    follower = StreamFollower(
        run_dir.status,
        from_seq=last.seq if last else -1,
        run=last.run if last else None,
    )
    rev = _current_rev(run_dir) + 1
    atomic_write_text(run_dir.control, protocol.ControlFile(rev, {key: value}).to_json() + "\n")
    common: dict[str, Any] = {"key": key, "value": value, "rev": rev}
    deadline = time.monotonic() + wait_s
    try:
        while True:
            answer = _answer(follower, rev)
            if answer is not None:
                break
            if time.monotonic() >= deadline:
                return protocol.reply_error(
                    "set",
                    "no_answer",
                    f"control.json rev {rev} written; the trainer did not answer within "
                    f"{wait_s:g} s (it may still apply it)",
                    **common,
                )
            time.sleep(POLL_S)
    finally:
        follower.close()
    message = str(answer.get("message", ""))
    if answer.get("code") == "control_rejected":
        return protocol.reply_error("set", "control_rejected", f"{key}: {message}", **common)
    settings: Mapping[str, Any] = answer.get("settings") or {}
    return protocol.reply_ok("set", **common, message=message, settings=dict(settings))
