"""bench/quality/call_rate.py on the streams session 39's two `train` calls brought back
(committed in bench/results/quality_smollm2/run12/streams.tar.gz): what the first trained before
its SIGTERM, the schedule its rate puts in reach of later calls, a compile that fell back
said by name, and a completed run that plans nothing more."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STREAMS = REPO / "bench/results/quality_smollm2/run12/streams.tar.gz"


def _lines(name: str) -> list[dict[str, Any]]:
    with tarfile.open(STREAMS) as tar:
        member = tar.extractfile(name)
        assert member is not None, name
        return [json.loads(line) for line in member.read().decode().splitlines()]


def _call_rate(tmp_path: Path, lines: list[dict[str, Any]], *args: str) -> dict[str, Any]:
    stream = tmp_path / "call.status.jsonl"
    stream.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [sys.executable, "bench/quality/call_rate.py", str(stream), *args]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_signalled_call_gives_its_rate_start_up_and_the_schedule_in_reach(
    tmp_path: Path,
) -> None:
    lines = _lines("train1.status.jsonl")
    args = ("--call-s", "560", "--next-s", "560", "--next-s", "430")
    figures = _call_rate(tmp_path, lines, *args)
    # the call's SIGTERM checkpoint: steps 0 to 2,602, eager kernels, five evaluations
    assert (figures["start_step"], figures["reached"], figures["end"]) == (0, 2602, "signal")
    assert figures["kernels"] == {"drafter_layers": "eager", "target_layers": "eager"}
    assert figures["compile_events"] == [] and figures["warnings"] == []
    assert len(figures["eval_s"]) == 5 and max(figures["eval_s"]) < 10
    steps = [line for line in lines if line["kind"] == "step"]
    rate = (steps[-1]["step"] - steps[0]["step"]) / (steps[-1]["t"] - steps[0]["t"])
    assert math.isclose(figures["steps_per_s"], rate, abs_tol=5e-4)
    # 2,602 steps at that rate fill 527 of the 560 s: 33 s of loading and the last step
    assert math.isclose(figures["start_up_s"], 560 - 2602 / rate, abs_tol=0.05)
    assert 30 < figures["start_up_s"] < 36
    rate, start_up = figures["steps_per_s"], figures["start_up_s"]
    after = [math.floor(rate * (s - start_up)) for s in (560, 430)]
    assert figures["schedule"] == 2602 + sum(after)
    # later calls that start faster than this one (warm compile caches) train more
    warm = _call_rate(tmp_path, lines, *args, "--next-start-up-s", "20")
    assert warm["start_up_s"] == figures["start_up_s"]
    assert warm["schedule"] == 2602 + sum(math.floor(rate * (s - 20)) for s in (560, 430))
    assert warm["schedule"] > figures["schedule"]


def test_a_compile_that_fell_back_is_said_and_a_completed_run_plans_no_more(
    tmp_path: Path,
) -> None:
    lines = _lines("train1.status.jsonl")
    at = next(i for i, line in enumerate(lines) if line["kind"] == "run_start")
    message = "drafter warm-up failed with its layers compiled; running them eagerly"
    failed = {
        "v": 1, "seq": 0, "t": lines[at]["t"] + 1, "run": lines[at]["run"], "kind": "event",
        "level": "warning", "code": "compile_failed", "message": message,
    }  # fmt: skip
    figures = _call_rate(tmp_path, [*lines[: at + 1], failed, *lines[at + 1 :]], "--call-s", "560")
    assert figures["compile_events"] == [{"code": "compile_failed", "message": message}]
    assert figures["warnings"] == [message]

    args = ("--call-s", "430", "--next-s", "560")
    figures = _call_rate(tmp_path, _lines("train2.status.jsonl"), *args)
    assert (figures["start_step"], figures["reached"], figures["end"]) == (2602, 4400, "completed")
    assert figures["start_up_s"] is None and figures["schedule"] == 4400
