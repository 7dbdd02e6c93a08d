"""The whole-run history: bounded memory over a 200,000-step run, step 1 always in view, exact
at bucket resolution, and the attach summary joined with live steps without a seam."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_tui.sources.bucket_level import BucketLevel
from dflash_tui.sources.run_history import RECENT_LEVELS, WHOLE_BUCKETS, MetricHistory
from dflash_tui.sources.state import RunState
from tests.tui.synthetic_stream import RUN_ID, T0, step_fields

STEPS = 200_000


def loss_at(step: int) -> float:
    spike = 40.0 if step == 123_457 else 0.0
    return 1.6 + 6.5 * math.exp(-step / 20_000) + 0.15 * math.sin(step / 7) + spike


def test_a_200k_step_run_stays_bounded_keeps_step_1_and_matches_a_full_recomputation() -> None:
    history = MetricHistory()
    sizes = []
    for step in range(1, STEPS + 1):
        history.add(step, loss_at(step), T0 + step * 2.9)
        # Step 1 is the first thing on the whole-run plot after every live step.
        assert history.first_x == 1
        if step % 20_000 == 0:
            history.flush()
            sizes.append(history.nbytes())
    history.flush()
    whole = history.whole
    assert len(whole) <= WHOLE_BUCKETS
    # Bounded by the levels' caps (six 8-byte columns, a ring level trims at cap * 1.25,
    # arrays over-allocate a little), however long the run: flat after the first hour.
    buckets = sum(RECENT_CAP * 5 // 4 for _, RECENT_CAP in RECENT_LEVELS) + WHOLE_BUCKETS
    bound = buckets * 6 * 8 * 1.15
    assert all(size <= bound for size in sizes), (sizes, bound)

    # A full recomputation from every point, grouped at the level's final resolution.
    groups: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for step in range(1, STEPS + 1):
        groups[step // whole.width].append((step, loss_at(step)))
    assert len(groups) == len(whole)
    for i, key in enumerate(sorted(groups)):
        points = groups[key]
        values = [v for _, v in points]
        assert whole.x0[i] == points[0][0]
        assert whole.lo[i] == min(values) and whole.hi[i] == max(values)
        assert whole.n[i] == len(values)
        assert whole.total[i] / whole.n[i] == pytest.approx(sum(values) / len(values))
    # The view of the whole run at a pane's width keeps the spike and starts at step 1.
    view = history.view(None, 150)
    assert len(view) <= 150 and view.xs[0] == 1
    assert max(view.highs) == loss_at(123_457)
    # A last-10-minutes view comes from the raw level: one column per step.
    recent = history.view(T0 + STEPS * 2.9 - 600, 400)
    assert recent.xs[-1] == STEPS and recent.xs[0] >= STEPS - 210
    assert history.level_for(T0 + STEPS * 2.9 - 600).width == 1


def test_a_ring_level_drops_its_oldest_buckets_in_batches() -> None:
    level = BucketLevel(1, 100)
    for step in range(1000):
        level.add(step, float(step), float(step))
        assert len(level) <= 125
    assert level.x0[-1] == 999 and len(level) >= 100


def test_repeated_steps_after_a_resume_join_the_newest_bucket() -> None:
    level = BucketLevel(1, 10, merging=True)
    level.extend([1, 2, 3, 2, 3], [1.0, 2.0, 3.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0])
    level.add(4, 4.0, 6.0)
    assert list(level.x0) == [1, 2, 3, 4]
    assert list(level.n) == [1, 1, 3, 1]


def line(kind: str, seq: int, t: float, **fields: object) -> protocol.StatusLine:
    decoded = protocol.decode_line(protocol.encode_line(kind, seq=seq, run=RUN_ID, t=t, **fields))
    assert isinstance(decoded, protocol.StatusLine), decoded
    return decoded


def test_summary_then_live_steps_read_as_one_run_from_its_first_step(tmp_path: Path) -> None:
    # What `tail --history` sends for a long run: sparse points marked history, then the
    # live steps; the plot must span both, from the run's first step.
    state = RunState()
    seq = 0
    for step in range(1, 100_001, 500):
        fields = {**step_fields(step, 20_000, 6), "history": True}
        state.apply(line("step", seq, T0 + step, **fields))
        seq += 1
    state.apply(line("checkpoint", seq, T0 + 50_000, step=50_000, path="c/step_0050000", seconds=3))
    for step in range(100_001, 106_001):
        seq += 1
        state.apply(line("step", seq, T0 + step, **step_fields(step, 20_000, 6)))
        # Starts at step 1 after every live step, and ends at that step.
        assert state.history.first_x("loss") == 1
        if step % 250 == 0:
            assert state.history.view("loss", None, 120).last_x == step
    view = state.history.view("loss", None, 120)
    assert view.xs[0] == 1 and len(view) <= 120
    assert [m.kind for m in state.history.markers] == ["checkpoint"]
    # The last 10 minutes come from live steps only, one column each.
    recent = state.history.view("loss", state.since(600), 1000)
    assert recent.xs[0] >= 106_000 - 601 and recent.xs[-1] == 106_000


def test_eval_tau_stage_times_starved_and_markers_reach_the_history() -> None:
    state = RunState()
    start = {"config": {}, "topology": {}, "dataset": {}, "batches_per_epoch": 10,
             "total_steps": 100, "pid": 1, "host": "h"}  # fmt: skip
    state.apply(line("run_start", 0, T0, **start))
    state.apply(line("step", 1, T0 + 1, **step_fields(5, 10, 1)))
    state.apply(line("profile", 2, T0 + 2, stages_ms={"target_fwd": 580.5, "copy": 130.0},
                     allocator={}))  # fmt: skip
    queue = {"hs_ready": 4, "hs_queue_depth": 8, "hs_min_ready": 2, "producer_wait": 0.1,
             "consumer_wait": 0.0, "starved": 0.25, "bucket_mix": {}}  # fmt: skip
    state.apply(line("queue", 3, T0 + 3, **queue))
    # An eval event with the fields the protocol requires of one (EVENT_CODE_FIELDS).
    state.apply(line("event", 4, T0 + 4, level="info", code="eval", message="eval", tau=2.75,
                     step=5, tau_tf=2.9, lossless=True, prompts=2, tokens=16,
                     seconds=1.5))  # fmt: skip
    state.apply(line("checkpoint", 5, T0 + 5, step=5, path="c/step_0000005", seconds=1.0))
    state.apply(line("run_start", 6, T0 + 6, **start, start_step=5, resumed_from="c/step_5"))
    state.apply(line("run_end", 7, T0 + 7, reason="completed", exit_code=0))
    history = state.history
    assert history.names("stage.") == ["stage.copy", "stage.target_fwd"]
    assert history.view("stage.target_fwd", None, 10).means == [580.5]
    assert history.view("eval_tau", None, 10).xs == [5] and history.series["eval_tau"].last == 2.75
    assert history.view("starved", None, 10).means == [0.25]
    assert [(m.kind, m.step) for m in history.markers] == [
        ("start", 0), ("checkpoint", 5), ("resume", 5), ("end", 5)
    ]  # fmt: skip
