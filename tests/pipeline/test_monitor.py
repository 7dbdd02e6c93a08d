"""MonitorThread: the single writer of the stream. Real writer, pool, timers, control file
and drafter snapshots; the stream it writes must decode with protocol.decode_line."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from pathlib import Path

import torch
from tiny_parts import BLOCK

from dflash_train import protocol
from dflash_train.pipeline.control_watch import ControlWatcher
from dflash_train.pipeline.drafter_step import (
    BAD_STEPS,
    GOOD_STEPS,
    GRAD_NORM_SUM,
    LOSS_SUM,
    MAX_STREAK,
    N_SCALARS,
    N_SLOT_SUMS,
    STEPS,
    MetricsSnapshot,
)
from dflash_train.pipeline.monitor import MonitorIntervals, MonitorThread, StepRecord
from dflash_train.pipeline.pool import HiddenStatePool
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.rundir import atomic_write_text
from dflash_train.stream.writer import StatusWriter

FAST = MonitorIntervals(tick=0.02, queue=0.15, gpu=0.15, control=0.05, heartbeat=0.4, profile=0.3)


def _snapshot(*, loss: float, steps: int, bad: int = 0, streak: int = 0) -> MetricsSnapshot:
    values = torch.zeros(N_SCALARS + N_SLOT_SUMS * (BLOCK - 1))
    good = steps - bad
    values[LOSS_SUM] = loss * good
    values[GRAD_NORM_SUM] = 0.5 * good
    values[STEPS], values[GOOD_STEPS], values[BAD_STEPS] = steps, good, bad
    values[MAX_STREAK] = streak
    # slot_correct, slot_total, run_correct, run_total: 10 blocks whose slots are right
    # 8, 6 and 4 times, in leading runs that reach slot 1 in 8 blocks, 2 in 6, 3 in 3
    sums = ([8.0, 6.0, 4.0], [10.0] * 3, [8.0, 6.0, 3.0], [10.0, 8.0, 6.0])
    values[N_SCALARS:] = torch.tensor(sums).flatten()
    return MetricsSnapshot(values, None)


def _lines(path: Path) -> list[protocol.StatusLine]:
    decoded = [protocol.decode_line(raw) for raw in path.read_bytes().splitlines()]
    assert all(isinstance(d, protocol.StatusLine) for d in decoded), decoded
    return decoded  # type: ignore[return-value]


def _wait_for(path: Path, predicate: object, timeout: float = 5.0) -> list[protocol.StatusLine]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = _lines(path) if path.exists() else []
        if any(predicate(line) for line in lines):  # type: ignore[operator]
            return lines
        time.sleep(0.02)
    raise AssertionError(f"no matching line in {path}")


def test_monitor_writes_steps_queue_gpu_profile_control_and_heartbeat(tmp_path: Path) -> None:
    status = tmp_path / "status.jsonl"
    writer = StatusWriter(status, "run1")
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=2)
    settings = {"hs_queue_depth": 8, "hs_min_ready": 2}

    def apply(updates: dict[str, int]) -> None:
        merged = {**settings, **updates}
        pool.set_limits(depth=merged["hs_queue_depth"], min_ready=merged["hs_min_ready"])
        settings.update(merged)

    control = ControlWatcher(
        tmp_path / "control.json", current=lambda: settings, apply=apply, baseline_rev=None
    )
    timers = StageTimers()
    with timers.time("target_fwd"):
        time.sleep(0.01)
    fatal: list[str] = []
    monitor = MonitorThread(
        writer,
        block_size=BLOCK,
        max_bad_steps=3,
        on_fatal=fatal.append,
        timers=timers,
        pool=pool,
        settings=lambda: settings,
        control=control,
        intervals=FAST,
    )
    monitor.mark_start()
    monitor.start()
    time.sleep(0.05)
    monitor.submit_step(
        StepRecord(
            step=1,
            epoch=0,
            epoch_progress=0.25,
            lr=1e-3,
            tokens_total=2000,
            tokens_interval=2000,
            at=time.monotonic(),
            metrics=_snapshot(loss=2.5, steps=1),
        )
    )
    monitor.emit("checkpoint", step=1, path="/x/step_0000001", seconds=0.1)
    pool.put(1, bucket="3")
    atomic_write_text(
        tmp_path / "control.json", protocol.ControlFile(4, {"hs_min_ready": 5}).to_json()
    )
    _wait_for(status, lambda line: line.kind == "event" and line["code"] == "control_applied")
    _wait_for(status, lambda line: line.kind == "profile")
    # A queue line after the change (queue lines come on their own interval, not with it).
    _wait_for(
        status, lambda line: line.kind == "queue" and line["hs_min_ready"] == 5 and line["hs_ready"]
    )
    monitor.submit_step(
        StepRecord(
            2,
            0,
            0.5,
            1e-3,
            2500,
            500,
            time.monotonic(),
            _snapshot(loss=0, steps=3, bad=3, streak=3),
        )
    )
    monitor.stop()
    lines = _lines(status)
    kinds = [line.kind for line in lines]
    assert {"step", "checkpoint", "queue", "gpu", "profile", "event"} <= set(kinds)
    assert [line.seq for line in lines] == list(range(len(lines)))
    step = next(line for line in lines if line.kind == "step")
    assert step["loss"] == 2.5 and step["tokens"] == 2000 and step["ktok_s"] > 0
    assert abs(step["acc"] - 0.6) < 1e-6  # the slots' accuracies, 0.8, 0.6 and 0.4
    # tau: 1 + the mean leading run (8 + 6 + 3 slots over 10 blocks), not the product of
    # the slots' accuracies (1 + 0.8 + 0.48 + 0.192)
    assert abs(step["tau"] - 2.7) < 1e-6
    assert kinds.index("checkpoint") == kinds.index("step") + 1  # queued order kept
    applied = next(line for line in lines if line.get("code") == "control_applied")
    assert applied["rev"] == 4 and applied["settings"]["hs_min_ready"] == 5
    assert pool.limits["hs_min_ready"] == 5
    queue = [line for line in lines if line.kind == "queue"]
    assert queue[-1]["hs_min_ready"] == 5 and queue[-1]["hs_ready"] == 1
    assert queue[-1]["bucket_mix"] == {"3": 1}
    gpu = next(line for line in lines if line.kind == "gpu")
    assert gpu["available"] is False and gpu["reason"]
    profile = next(line for line in lines if line.kind == "profile")
    assert profile["stages_ms"]["target_fwd"] >= 10
    last_step = [line for line in lines if line.kind == "step"][-1]
    assert last_step["loss"] is None and last_step["bad_steps"] == 3
    assert any(line.get("code") == "nonfinite_step" and line["level"] == "error" for line in lines)
    assert fatal and "3 non-finite steps in a row" in fatal[0]


def test_heartbeat_only_when_nothing_else_was_written(tmp_path: Path) -> None:
    status = tmp_path / "status.jsonl"
    quiet = MonitorIntervals(tick=0.02, queue=60, gpu=60, control=60, heartbeat=0.2, profile=60)
    monitor = MonitorThread(
        StatusWriter(status, "r"),
        block_size=BLOCK,
        max_bad_steps=3,
        on_fatal=lambda _m: None,
        timers=StageTimers(),
        intervals=quiet,
    )
    monitor.start()
    deadline = time.monotonic() + 30
    while sum(line.kind == "heartbeat" for line in _lines(status)) < 3:
        assert time.monotonic() < deadline, "fewer than 3 heartbeats in 30 s"
        time.sleep(0.02)
    monitor.stop()
    lines = _lines(status)
    # The first tick writes queue and gpu once; then only heartbeats fill the silence, one
    # per quiet interval (0.2 s) at most: a late tick on a loaded machine spaces them more.
    assert [line.kind for line in lines[:2]] == ["queue", "gpu"]
    assert {line.kind for line in lines[2:]} == {"heartbeat"}
    times = [line.t for line in lines[1:]]
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(times)), times


def test_rejected_control_answers_with_reason_and_rev(tmp_path: Path) -> None:
    status = tmp_path / "status.jsonl"
    settings = {"hs_queue_depth": 4, "hs_min_ready": 2}
    control = ControlWatcher(
        tmp_path / "control.json",
        current=lambda: settings,
        apply=settings.update,
        baseline_rev=None,
    )
    monitor = MonitorThread(
        StatusWriter(status, "r"),
        block_size=BLOCK,
        max_bad_steps=3,
        on_fatal=lambda _m: None,
        timers=StageTimers(),
        settings=lambda: settings,
        control=control,
        intervals=FAST,
    )
    monitor.start()
    atomic_write_text(
        tmp_path / "control.json", protocol.ControlFile(2, {"hs_min_ready": 9}).to_json()
    )
    lines = _wait_for(status, lambda line: line.get("code") == "control_rejected")
    monitor.stop()
    rejected = next(line for line in lines if line.get("code") == "control_rejected")
    assert (
        rejected["rev"] == 2
        and "hs_min_ready: 9 is out of range 1..hs_queue_depth=4" in rejected["message"]
    )
    assert settings["hs_min_ready"] == 2
    sync_queue = next(line for line in _lines(status) if line.kind == "queue")
    assert sync_queue["pipeline"] == "sync" and sync_queue["hs_queue_depth"] == 4


def test_monitor_falls_silent_when_training_makes_no_progress(tmp_path: Path) -> None:
    status = tmp_path / "status.jsonl"
    intervals = MonitorIntervals(
        tick=0.02, queue=0.1, gpu=60, control=60, heartbeat=0.1, profile=60, stall=0.4
    )
    monitor = MonitorThread(
        StatusWriter(status, "r"),
        block_size=BLOCK,
        max_bad_steps=3,
        on_fatal=lambda _m: None,
        timers=StageTimers(),
        intervals=intervals,
    )
    monitor.mark_start()
    monitor.start()
    _wait_for(status, lambda line: line.get("code") == "no_progress")
    count = len(_lines(status))
    time.sleep(0.5)
    assert len(_lines(status)) == count  # silent: `status` will see a stalled run
    monitor.touch()
    # Progress brings the periodic lines back.
    _wait_for(status, lambda line: line.seq >= count and line.kind in ("queue", "heartbeat"))
    monitor.stop()


def test_a_starving_drafter_gets_split_advice(tmp_path: Path) -> None:
    """One target GPU and three drafter GPUs; the drafter waits on an empty pool for the
    whole (shortened) advice window, its stage twice as fast as the target's: the monitor
    names the split of the four GPUs that the planner (pipeline/split_plan.py) finds best."""
    status = tmp_path / "status.jsonl"
    writer = StatusWriter(status, "run1")
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=1)
    timers = StageTimers()

    def fill_timers() -> None:  # 8,000-token batches: 20 Ktok/s a target, 40 a drafter
        timers._add("target_fwd", 400.0)
        timers._add("drafter_fwd_bwd", 180.0)
        timers._add("optimizer", 20.0)

    fill_timers()
    roles = {0: "target", 1: "drafter", 2: "drafter", 3: "drafter"}
    monitor = MonitorThread(
        writer, block_size=BLOCK, max_bad_steps=3, on_fatal=lambda _m: None, timers=timers,
        pool=pool, settings=lambda: {"hs_queue_depth": 8, "hs_min_ready": 1}, gpu_roles=roles,
        intervals=dataclasses.replace(FAST, profile=0.5, advice=1.0),
    )  # fmt: skip
    done = threading.Event()

    def slow_target() -> None:
        while not done.is_set():
            time.sleep(0.05)
            pool.put(1)

    def starving_drafter() -> None:  # takes each batch the moment it is there
        while pool.take(should_stop=done.is_set) is not None:
            pass

    for part in (slow_target, starving_drafter):
        threading.Thread(target=part, daemon=True).start()
    monitor.mark_start()
    monitor.start()
    monitor.submit_step(
        StepRecord(1, 0, 0.1, 1e-3, 16_000, 16_000, time.monotonic(), _snapshot(loss=2.0, steps=2))
    )

    def advised(line: protocol.StatusLine) -> bool:
        if line.kind == "profile":  # each profile empties the timers: keep them filled
            fill_timers()
        return line.kind == "event" and line["code"] == "split_advice"

    try:
        lines = _wait_for(status, advised, timeout=15.0)
    finally:
        done.set()
        monitor.stop()
    advice = [line for line in lines if line.kind == "event" and line["code"] == "split_advice"]
    assert len(advice) == 1 and advice[0]["level"] == "info"
    # 1:3 runs at min(20, 120) = 20; 2:2 and 3:1 both at 40, 3:1 with its slower stage busier.
    assert advice[0]["split"] == [3, 1] and advice[0]["current_split"] == [1, 3]
    assert advice[0]["predicted_ktok_s"] == 40.0 and advice[0]["current_ktok_s"] == 20.0
    assert advice[0]["message"].startswith("the drafter waited ")
    assert (
        "3:1 targets:drafters would give ~40.0 Ktok/s against ~20.0 at 1:3" in advice[0]["message"]
    )


def test_no_split_advice_without_a_gpu_of_each_kind() -> None:
    from dflash_train.pipeline.split_advice import SplitAdvisor

    assert SplitAdvisor.for_roles({}) is None
    assert SplitAdvisor.for_roles({0: "target+drafter"}) is None
    assert SplitAdvisor.for_roles({0: "target", 1: "target"}) is None
    advisor = SplitAdvisor.for_roles({0: "target", 1: "drafter"}, sustain=10.0)
    assert advisor is not None and (advisor.targets, advisor.drafters) == (1, 1)
    advisor.observe_tokens(8000)
    advisor.observe_profile({"target_fwd": 400.0, "drafter_fwd_bwd": 400.0})
    for t in range(12):  # both sides wait a little: balanced, nothing to say
        advisor.observe_queue(float(t), 0.05, 0.05)
    assert advisor.advice(11.0) is None
