"""What one `train` call of a quality session trained, from the status stream it brought back
(`train1.status.jsonl`), and how long a schedule the session's later calls can finish: read
between calls, where a warm machine waits only half a minute for the next one.

    python bench/quality/call_rate.py OUT/train1.status.jsonl --call-s 560 --next-s 560 --next-s 430

--call-s is this call's TRAIN_END_S; each --next-s a later call's. `start_up_s` is the part of
the call that trained no step (loading, any compile, the SIGTERM's last step): TRAIN_END_S
less the steps over the rate (none for a run that completed before it). `schedule` is the
steps reached plus what each later call trains at this rate after the same start-up, or
after --next-start-up-s where later calls start faster (a compiled run's first call compiles
cold, a later one on the same machine from warm caches: 59 s against 31 in session 41): the
`STEPS` to give them (a resume with another --max-steps follows that length's cosine from
the resumed step). The kernels, compile events and evaluation seconds say whether the rate
is the kernels' or a stall's.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from dflash_train.pipeline.split_plan import read_stream
from dflash_train.protocol import StatusLine

COMPILE_CODES = ("compiling", "compiled", "compile_failed")


def call_figures(lines: list[StatusLine], call_s: float) -> dict[str, Any]:
    """The call's run (its last `run_start` on): steps, rate, start-up, kernels, events."""
    starts = [i for i, line in enumerate(lines) if line.kind == "run_start"]
    if not starts:
        raise SystemExit("call_rate: no run_start in the stream")
    run = lines[starts[-1] :]
    start = run[0]
    steps = [line for line in run if line.kind == "step"]
    if len(steps) < 2:
        raise SystemExit(f"call_rate: {len(steps)} step lines, two needed for a rate")
    first, last = steps[0], steps[-1]
    rate = (last["step"] - first["step"]) / (last.t - first.t)
    ends = [line for line in run if line.kind == "run_end"]
    reached = ends[-1]["step"] if ends else last["step"]
    trained = reached - start.get("start_step", 0)
    completed = bool(ends) and ends[-1]["reason"] == "completed"
    events = [line for line in run if line.kind == "event"]
    return {
        "start_step": start.get("start_step", 0),
        "reached": reached,
        "steps_per_s": round(rate, 3),
        # a run that completed before TRAIN_END_S says nothing of the time a call loses
        "start_up_s": None if completed else round(call_s - trained / rate, 1),
        "first_step_after_run_start_s": round(first.t - start.t, 1),
        "end": ends[-1]["reason"] if ends else None,
        "kernels": {
            k: (start.get("kernels") or {}).get(k) for k in ("drafter_layers", "target_layers")
        },
        "compile_events": [
            {"code": e["code"], "message": e.get("message")}
            for e in events
            if e.get("code") in COMPILE_CODES
        ],
        "eval_s": [e.get("seconds") for e in events if e.get("code") == "eval"],
        "warnings": [e.get("message") for e in events if e.get("level") == "warning"],
    }


def schedule(figures: dict[str, Any], next_s: list[float], start_up: float | None = None) -> int:
    """The steps reached plus what each later call trains after start_up seconds, this
    call's own by default (a completed run: the steps reached, its schedule done)."""
    rate = figures["steps_per_s"]
    if figures["start_up_s"] is None:
        return figures["reached"]
    if start_up is None:
        start_up = figures["start_up_s"]
    return figures["reached"] + sum(math.floor(rate * max(0.0, s - start_up)) for s in next_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stream", type=Path, help="the call's status stream")
    parser.add_argument("--call-s", type=float, required=True, help="this call's TRAIN_END_S")
    parser.add_argument(
        "--next-s", type=float, action="append", default=[], help="a later call's TRAIN_END_S"
    )
    parser.add_argument(
        "--next-start-up-s",
        type=float,
        help="the seconds a later call trains no step (default: this call's start_up_s)",
    )
    args = parser.parse_args()
    try:
        lines = read_stream(args.stream)
    except OSError as exc:
        raise SystemExit(f"call_rate: {args.stream}: unreadable ({exc})") from None
    figures = call_figures(lines, args.call_s)
    figures["schedule"] = schedule(figures, args.next_s, args.next_start_up_s)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
