"""One ETA in every view, from the current segment's pace: a run that crawled at 10 s a
step, stalled for ten minutes, picked up at 3 s a step and was restarted shows the ETA of
3 s a step in a dashboard attached late, in its fleet row and in a replay alike; and none
once it is not running."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_train.control.tail import tail_stream
from dflash_train.protocol import StatusLine
from dflash_tui.sources.fleet import TAIL_LINES
from dflash_tui.sources.pace import SegmentPace
from dflash_tui.sources.replay import ReplayClock, Timeline
from dflash_tui.sources.state import RunState

RUN = "pace0001"
TOTAL = 2000


def stream_lines() -> list[str]:
    """run_start; 100 steps at 10 s; a 600 s stall; 100 steps at 3 s; a restart resuming
    at step 190 (from a checkpoint), then 20 steps at 3 s. Queue lines between the steps,
    as a monitor writes them."""
    out: list[str] = []
    t = 1_000_000.0

    def add(kind: str, **fields: object) -> None:
        out.append(protocol.encode_line(kind, seq=len(out), run=RUN, t=t, **fields))

    def start(step: int) -> None:
        add("run_start", config={"epochs": 1}, topology={}, dataset={},
            batches_per_epoch=TOTAL, total_steps=TOTAL, pid=1, host="box",
            start_step=step, resumed_from="ckpt" if step else None)  # fmt: skip

    def steps(first: int, count: int, every: float) -> None:
        nonlocal t
        for n in range(first, first + count):
            t += every
            add("step", step=n, epoch=0, epoch_progress=n / TOTAL, loss=2.0, acc=0.5,
                tau=2.0, lr=1e-4, grad_norm=1.0, tokens=n, ktok_s=1.0)  # fmt: skip
            add("heartbeat")

    start(0)
    steps(1, 100, 10.0)
    t += 600.0
    steps(101, 100, 3.0)
    t += 20.0
    start(190)
    steps(191, 20, 3.0)
    return out


def decoded(raw: str | bytes) -> StatusLine:
    line = protocol.decode_line(raw)
    assert isinstance(line, StatusLine), line
    return line


def test_dashboard_fleet_and_replay_agree_on_the_current_segments_pace(tmp_path: Path) -> None:
    raws = stream_lines()
    last = decoded(raws[-1])
    now = last.t + 1.0
    expected = (TOTAL - 210) * 3.0

    # A dashboard attached before the restart: the history summary, then live lines.
    attach_at = len(raws) - 30
    path = tmp_path / "status.jsonl"
    path.write_text("".join(raws[:attach_at]))
    summary = io.BytesIO()
    tail_stream(path, summary, history_points=50)
    dashboard = RunState(clock=lambda: now)
    for raw in [*summary.getvalue().splitlines(), *raws[attach_at:]]:
        dashboard.apply(decoded(raw))

    # A fleet row: the stream from TAIL_LINES before its end.
    fleet = RunState(clock=lambda: now)
    for raw in raws[-TAIL_LINES:]:
        fleet.apply(decoded(raw))

    # A replay at the last line.
    clock = ReplayClock()
    replay = Timeline([r.encode() for r in raws], clock=clock).seek(len(raws) - 1)

    for view in (dashboard, fleet, replay):
        assert view.run_state == "running"
        assert view.eta_s == pytest.approx(expected, rel=0.05)


def test_no_eta_unless_running() -> None:
    raws = stream_lines()
    last = decoded(raws[-1])
    clock = [last.t + 1.0]
    state = RunState(clock=lambda: clock[0])
    for raw in raws:
        state.apply(decoded(raw))
    assert state.eta_s is not None
    clock[0] = last.t + 120.0  # silent past the stall threshold
    assert state.run_state == "stalled" and state.eta_s is None
    clock[0] = last.t + 1.0
    state.crashed_by_status = True  # the box says the trainer is gone
    assert state.run_state == "crashed" and state.eta_s is None
    state.crashed_by_status = False
    end = protocol.encode_line("run_end", seq=len(raws), run=RUN, t=last.t, reason="signal",
                               exit_code=0)  # fmt: skip
    state.apply(decoded(end))
    assert state.run_state == "stopped" and state.eta_s is None


def test_segment_pace_leaves_out_stall_gaps_and_starts_again_on_a_restart() -> None:
    pace = SegmentPace(gap_s=60.0)
    for n in range(10):
        pace.add(n, n * 2.0)
    assert pace.steps_per_s == pytest.approx(0.5)
    pace.add(10, 18.0 + 300.0)  # a stall: left out
    pace.add(11, 318.0 + 2.0)
    assert pace.steps_per_s == pytest.approx(0.5)
    pace.restart()
    assert pace.steps_per_s is None
    pace.add(11, 400.0)
    pace.add(12, 404.0)
    assert pace.steps_per_s == pytest.approx(0.25)
    pace.add(5, 405.0)  # resumed from an older checkpoint without a run_start seen
    assert pace.steps_per_s is None
