"""The one human line every control reply carries as `message`, so a console (or a person
reading the JSON) can show it as it is: "restarted: resumed from step 73 in 5.4 s, run
1f900d3a, pid 9569". A reply that brings its own message keeps it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from dflash_train.protocol import Reply

_STEP_DIR = re.compile(r"step_0*(\d+)")


def with_message(reply: Reply) -> Reply:
    if isinstance(reply.data.get("message"), str) and reply.data["message"]:
        return reply
    data = {**reply.data, "message": describe(reply)}
    return Reply(reply.command, reply.ok, data, reply.error_code, reply.error)


def describe(reply: Reply) -> str:
    if not reply.ok:
        return f"{reply.command} failed: {reply.error}"
    text = _DESCRIBE.get(reply.command)
    return text(reply.data) if text is not None else f"{reply.command}: done"


def _seconds(data: Mapping[str, Any]) -> str:
    seconds = data.get("seconds")
    return f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""


def _started(data: Mapping[str, Any]) -> str:
    return f"run {data.get('run_id')}, pid {data.get('pid')}"


def _launch(data: Mapping[str, Any]) -> str:
    done = "; it has already finished" if data.get("finished") else ""
    doing = "preparing" if data.get("mode") == "prepare" else "training"
    return f"launched: {doing}{_seconds(data)}, {_started(data)}{done}"


def _restart(data: Mapping[str, Any]) -> str:
    resumed = data.get("resumed_from")
    if data.get("fresh"):
        how = "started fresh"
    elif isinstance(resumed, str) and (match := _STEP_DIR.search(resumed)):
        how = f"resumed from step {int(match.group(1))}"
    else:
        how = "started from scratch (no checkpoint yet)"
    text = f"restarted: {how}{_seconds(data)}, {_started(data)}"
    # What the operator's overrides changed, as the console shows it (issue 13), and the
    # live values set on the box that the restart kept over its record.
    text += _moves(data.get("changed"), "changed", "{name} {old}→{new}")
    text += _moves(data.get("carried"), "kept live", "{name} {new} (recorded {old})")
    previous = data.get("previous_run")
    if isinstance(previous, dict) and previous.get("dir"):
        # A fresh start leaves the old run where it was: say where (issue 12).
        text += f"; run {previous.get('run_id')}'s checkpoints are kept in {previous['dir']}"
    dropped = data.get("env_dropped") or []
    if dropped:
        text += f"; not passed again: {', '.join(str(d) for d in dropped)}"
    return text


def _moves(moves: Any, what: str, shape: str) -> str:
    """'; WHAT a 1→2, b 3→4' for a reply's {name: {"from": old, "to": new}}; '' for none."""
    if not isinstance(moves, dict) or not moves:
        return ""
    shown = (
        shape.format(name=name, old=_shown(c.get("from")), new=_shown(c.get("to")))
        for name, c in moves.items()
        if isinstance(c, dict)
    )
    return f"; {what} {', '.join(shown)}"


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ",".join(str(v).removeprefix("cuda:") for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _stop(data: Mapping[str, Any]) -> str:
    how = "killed" if data.get("stopped_by") == "kill" else "stopped"
    step = data.get("step")
    at = f" at step {step}" if isinstance(step, int) else ""
    return f"{how}: run {data.get('run_id')}{at}{_seconds(data)}, pid {data.get('pid')}"


def _status(data: Mapping[str, Any]) -> str:
    state = str(data.get("state", "unknown")).replace("_", " ")
    if data.get("state") == "not_started" and not data.get("run_id"):
        return f"no run in {data.get('run_dir')} yet"
    parts = [f"run {data.get('run_id')}"] if data.get("run_id") else []
    step, total = data.get("last_step"), data.get("total_steps")
    if isinstance(step, int):
        parts.append(f"step {step}" + (f"/{total}" if isinstance(total, int) else ""))
    age = data.get("last_line_age")
    if isinstance(age, (int, float)):
        parts.append(f"last line {age:.0f} s ago")
    if data.get("reason"):
        parts.append(f"ended: {data['reason']}")
    return f"{state}: " + ", ".join(parts) if parts else state


def _gpus(data: Mapping[str, Any]) -> str:
    if not data.get("available"):
        return f"no GPU readings: {data.get('reason')}"
    gpus = data.get("gpus") or []
    busy = sum(1 for g in gpus if isinstance(g, dict) and g.get("processes"))
    return f"{len(gpus)} GPUs, {busy} in use by a process"


_DESCRIBE: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "launch": _launch,
    "restart": _restart,
    "stop": _stop,
    "status": _status,
    "gpus": _gpus,
}
