"""`tail --history`: a min/max-preserving summary of the past as ordinary protocol lines,
a `history_end` marker, then live lines from the real cursor."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

from control_harness import decode_all, dflash_argv, run_start_fields, step_fields, write_stream

from dflash_train import protocol
from dflash_train.rundir import RunDir
from dflash_train.stream.summary import HistorySummary

POINTS = 40


def _gpu(util0: float, util1: float) -> dict[str, Any]:
    def reading(index: int, util: float) -> dict[str, Any]:
        return {
            "index": index,
            "name": "H200",
            "role": "target" if index == 0 else "drafter",
            "util": util,
            "mem_used": 1000.0 + util,
            "mem_total": 143000.0,
            "power_w": 300.0,
            "power_limit_w": 700.0,
            "temp_c": 50.0,
            "processes": [{"pid": 7, "gpu_mem": 10.0}],
        }

    return {"available": True, "reason": None, "gpus": [reading(0, util0), reading(1, util1)]}


def _queue(ready: int) -> dict[str, Any]:
    return {
        "hs_ready": ready,
        "hs_queue_depth": 8,
        "hs_min_ready": 2,
        "producer_wait": 0.1,
        "consumer_wait": 0.2,
        "starved": 0.0,
        "bucket_mix": {"a": 1},
    }


def _long_run(n: int) -> list[tuple[str, dict[str, Any]]]:
    lines: list[tuple[str, dict[str, Any]]] = [("run_start", run_start_fields())]
    for step in range(n):
        loss = 5.0 - step / n + 0.1 * math.sin(step)
        if step == 1234:
            loss = 99.0  # a spike a naive stride would drop
        if step == 2222:
            loss = -1.0
        lines.append(("step", step_fields(step, loss)))
        lines.append(("queue", _queue(9 if step == 777 else step % 5)))
        lines.append(("gpu", _gpu(100.0 if step == 1500 else 50.0, 0.0 if step == 10 else 40.0)))
        if step % 1000 == 999:
            lines.append(("checkpoint", {"step": step, "path": f"ckpt/{step}", "seconds": 1.0}))
            lines.append(("event", {"level": "info", "message": "epoch", "code": "epoch_end"}))
    return lines


def _tail(run_dir: Path, *args: str) -> list[protocol.StatusLine]:
    done = subprocess.run(
        dflash_argv("tail", str(run_dir), *args),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return decode_all(done.stdout)


def test_history_keeps_extremes_whole_lines_and_order(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    last_seq = write_stream(rundir.status, "run-h", _long_run(3000))
    lines = _tail(tmp_path, "--history", str(POINTS))
    marker = lines[-1]
    assert marker.kind == "event" and marker.get("code") == "history_end"
    assert marker.seq == last_seq and marker.get("cursor") == last_seq
    summary = lines[:-1]
    assert all(line.get("history") is True for line in lines)
    seqs = [line.seq for line in summary]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    by_kind: dict[str, list[protocol.StatusLine]] = {}
    for line in summary:
        by_kind.setdefault(line.kind, []).append(line)
    assert {k: len(v) <= POINTS for k, v in by_kind.items()} == {k: True for k in by_kind}
    assert len(by_kind["step"]) >= POINTS // 2
    losses = [line["loss"] for line in by_kind["step"]]
    assert max(losses) == 99.0 and min(losses) == -1.0
    assert max(line["hs_ready"] for line in by_kind["queue"]) == 9
    assert all(type(line["hs_ready"]) is int for line in by_kind["queue"])
    utils0 = [line["gpus"][0]["util"] for line in by_kind["gpu"]]
    utils1 = [line["gpus"][1]["util"] for line in by_kind["gpu"]]
    assert max(utils0) == 100.0 and min(utils1) == 0.0
    assert len(by_kind["run_start"]) == 1
    assert len(by_kind["checkpoint"]) == 3 and len(by_kind["event"]) == 3
    # Steps stay in step order: each summary line carries its bucket's edge step.
    steps = [line["step"] for line in by_kind["step"]]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 2999


def test_the_end_marker_dates_the_runs_last_line_heartbeats_included(tmp_path: Path) -> None:
    """The summary keeps no heartbeat, yet one is the newest line: the marker's `last_t`
    is its time, and the marker's own `t` is the box's clock as it is sent, so the console
    can tell how long the run had been silent without trusting its own clock."""
    rundir = RunDir.at(tmp_path)
    lines = [*_long_run(300), ("heartbeat", {}), ("heartbeat", {})]
    write_stream(rundir.status, "run-h", lines, t0=1000.0)
    before = time.time()
    sent = _tail(tmp_path, "--history", str(POINTS))
    marker = sent[-1]
    assert marker.get("code") == "history_end"
    assert not any(line.kind == "heartbeat" for line in sent)
    assert marker.get("last_t") == 1000.0 + (len(lines) - 1) * 0.001
    assert marker.t >= before


def test_short_history_is_sent_whole(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_stream(rundir.status, "run-h", _long_run(5))
    lines = _tail(tmp_path, "--history", str(POINTS))
    original = decode_all(rundir.status.read_bytes())
    assert [(x.seq, x.kind, dict(x.fields)) for x in lines[:-1]] == [
        (x.seq, x.kind, {**x.fields, "history": True}) for x in original
    ]


def test_history_then_live_lines_from_the_real_cursor(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    last_seq = write_stream(rundir.status, "run-h", _long_run(300))
    proc = subprocess.Popen(
        dflash_argv("tail", str(tmp_path), "--history", "20", "--follow", "--poll", "0.05"),
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        while True:
            line = decode_all(proc.stdout.readline())[0]
            if line.get("code") == "history_end":
                break
        write_stream(rundir.status, "run-h", [("step", step_fields(300))])
        live = decode_all(proc.stdout.readline())[0]
        assert live.seq == last_seq + 1 and live.get("history") is None
    finally:
        proc.kill()
        proc.wait()


def test_history_of_another_writers_lines_uses_full_decoding() -> None:
    # Fields written with spaces (another encoder): the one-scan fast path does not match,
    # each line is decoded instead, with the same result.
    summary = HistorySummary(4)
    lines = []
    for seq in range(40):
        fields = step_fields(seq, loss=100.0 if seq == 13 else 1.0)
        envelope = f'{{"v":1,"seq":{seq},"t":1.0,"run":"x","kind":"step", '
        lines.append(envelope.encode() + json.dumps(fields)[1:].encode())
    summary.add_block(b"\n".join(lines), after_seq=-1)
    decoded = [protocol.decode_line(x) for x in summary.lines()]
    assert all(isinstance(x, protocol.StatusLine) for x in decoded)
    assert 100.0 in [x["loss"] for x in decoded]  # type: ignore[index]
    assert len(decoded) <= 4
