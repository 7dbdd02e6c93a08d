"""RunState as a pure reducer: run reset, bounded buffers, run states, settings in force,
ETA, decimation, and a long history kept within its bounds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dflash_train import protocol
from dflash_train.protocol import Rejected, StatusLine
from dflash_tui.sources.state import RunState, decimate


def line(kind: str, seq: int, run: str = "r1", t: float | None = None, **fields: Any) -> StatusLine:
    decoded = protocol.decode_line(
        protocol.encode_line(kind, seq=seq, run=run, t=1000.0 + seq if t is None else t, **fields)
    )
    assert isinstance(decoded, StatusLine), decoded
    return decoded


def run_start(seq: int = 0, run: str = "r1", **config: Any) -> StatusLine:
    return line(
        "run_start",
        seq,
        run,
        config={"epochs": 3, "hs_min_ready": 2, "hs_queue_depth": 8, **config},
        topology={"target_gpus": ["cpu"], "drafter_gpus": ["cpu"]},
        dataset={"samples": 10},
        batches_per_epoch=10,
        total_steps=30,
        pid=1,
        host="box",
    )


def step(seq: int, n: int, run: str = "r1", t: float | None = None, **over: Any) -> StatusLine:
    fields = {
        "step": n,
        "epoch": n // 10,
        "epoch_progress": (n % 10) / 10,
        "loss": 5.0 - n * 0.1,
        "acc": 0.1 + n * 0.01,
        "tau": 1.5,
        "lr": 1e-4,
        "grad_norm": 1.0,
        "tokens": 100 * n,
        "ktok_s": 2.0,
    }
    return line("step", seq, run, t, **{**fields, **over})


def gpu(seq: int, run: str = "r1", util: float = 50.0, available: bool = True) -> StatusLine:
    gpus = [{"index": 0, "role": "target", "util": util, "power_w": 100.0}] if available else []
    return line("gpu", seq, run, available=available, gpus=gpus)


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def test_not_started_then_running_then_finished() -> None:
    clock = Clock()
    state = RunState(clock=clock)
    assert state.run_state == "not_started"
    assert state.last_line_age() is None
    state.apply(run_start())
    state.apply(step(1, 1))
    assert state.run_state == "running"
    assert (state.epochs, state.total_steps, state.step) == (3, 30, 1)
    state.apply(line("run_end", 2, reason="completed", exit_code=0))
    assert state.run_state == "finished"
    assert state.events[-1].code == "run_end"


def test_error_end_and_status_verdict_mean_crashed() -> None:
    state = RunState()
    state.apply(run_start())
    state.apply(line("run_end", 1, reason="error", exit_code=1, error_tail="Trace\nValueError: x"))
    assert state.run_state == "crashed"
    assert state.events[-1].level == "error" and "ValueError: x" in state.events[-1].text
    other = RunState()
    other.apply(run_start())
    other.apply_status(protocol.reply_ok("status", state="crashed"))
    assert other.run_state == "crashed"


def test_a_restart_reads_restarting_until_the_next_trainer_or_its_failure() -> None:
    from dflash_tui.sources.state import RESTART_WAIT_S

    clock = Clock()
    state = RunState(clock=clock)
    state.apply(run_start())
    state.apply(line("run_end", 1, reason="signal", exit_code=0, restarting=True))
    assert state.run_state == "restarting" and state.eta_s is None
    state.apply(run_start(2))  # the next trainer (a resume: the same run id)
    assert state.run_state == "running"
    state.apply(line("run_end", 3, reason="signal", exit_code=0, restarting=True))
    state.apply(line("event", 4, level="error", code="restart_failed", message="restart failed"))
    assert state.run_state == "stopped" and state.restart_failed
    # A restarter that died says nothing more: past RESTART_WAIT_S the run_end's reason.
    lost = RunState(clock=clock)
    lost.apply(run_start())
    lost.apply(line("run_end", 1, reason="signal", exit_code=0, restarting=True))
    clock.now += RESTART_WAIT_S - 1
    assert lost.run_state == "restarting"
    clock.now += 2
    assert lost.run_state == "stopped"
    plain = RunState(clock=clock)
    plain.apply(run_start())
    plain.apply(line("run_end", 1, reason="signal", exit_code=0))  # a plain `stop`
    assert plain.run_state == "stopped"


def test_stalled_after_silence_by_arrival_clock() -> None:
    clock = Clock()
    state = RunState(clock=clock, stall_after=30)
    state.apply(run_start())
    clock.now += 29
    assert state.state_at() == "running"
    assert state.last_line_age() == pytest.approx(29)
    clock.now += 2
    assert state.run_state == "stalled"
    state.apply(line("heartbeat", 1))
    assert state.run_state == "running"


def test_new_run_id_resets_everything_but_gpu_readings() -> None:
    state = RunState()
    state.apply(run_start())
    for i in range(1, 6):
        state.apply(step(i, i))
    state.apply(gpu(6))
    state.apply(line("event", 7, level="info", code="note", message="hello"))
    state.apply(run_start(0, run="r2"))
    assert state.run_id == "r2"
    assert state.step is None and not state.metrics["loss"] and not state.events
    assert state.gpus and state.gpus[0]["index"] == 0


def test_gpus_follow_lines_do_not_touch_the_run() -> None:
    state = RunState()
    state.apply(run_start())
    state.apply(line("gpu", 0, run="gpus", available=False, reason="no NVML", gpus=[]))
    assert state.run_id == "r1"
    assert state.gpu_unavailable == "no NVML"
    state.apply_gpu_reading(gpu(1, util=40))
    state.apply_gpu_reading(gpu(2, util=60))
    assert state.gpu_unavailable is None
    assert state.gpu_history == {0: [40.0, 60.0]}


def test_ring_buffers_are_bounded() -> None:
    state = RunState(history=50, gpu_history=20, events=10)
    state.apply(run_start())
    for i in range(1, 1001):
        state.apply(step(i, i))
        state.apply(gpu(i + 5000))
        state.apply(line("event", i + 10000, level="info", code="x", message=str(i)))
    assert len(state.metrics["loss"]) == 50
    assert state.metrics["loss"][-1][0] == 1000
    assert len(state.gpu_series["gpu0.util"]) == 20
    assert len(state.events) == 10


def test_settings_in_force_follow_start_queue_and_acks() -> None:
    state = RunState()
    state.apply(run_start(hs_min_ready=3, hs_queue_depth=16))
    assert state.settings == {"hs_min_ready": 3, "hs_queue_depth": 16}
    state.apply(
        line(
            "event",
            1,
            level="info",
            code="control_applied",
            message="applied hs_min_ready=9",
            rev=1,
        )
    )
    assert state.settings["hs_min_ready"] == 9
    queue = {"hs_ready": 4, "producer_wait": 0.1, "consumer_wait": 0.2, "starved": 0.0}
    state.apply(line("queue", 2, hs_queue_depth=32, hs_min_ready=12, bucket_mix={}, **queue))
    assert state.settings_in_force == {"hs_queue_depth": 32, "hs_min_ready": 12}
    assert state.queue is not None and state.queue["hs_ready"] == 4
    assert state.series("queue.hs_ready", 10) == [(1002.0, 4)]


def test_eta_from_recent_live_step_rate() -> None:
    state = RunState()
    state.apply(run_start())
    for i in range(1, 11):
        state.apply(step(i, i, t=100.0 + 2 * i))  # one step every 2 s
    assert state.steps_per_s == pytest.approx(0.5)
    assert state.eta_s == pytest.approx((30 - 10) * 2)
    assert state.latest("loss") == pytest.approx(4.0)
    assert state.average_ktok_s() == pytest.approx(2.0)


def test_non_finite_metrics_stay_out_of_series() -> None:
    state = RunState()
    state.apply(run_start())
    state.apply(step(1, 1, loss=float("nan")))
    assert state.latest("loss") is None
    assert not state.metrics["loss"]


def test_rejected_lines_are_counted_by_code() -> None:
    state = RunState()
    for raw in (b"{not json", b"[]", b'{"v":1}', b"\xff\xfe"):
        decoded = protocol.decode_line(raw)
        assert isinstance(decoded, Rejected)
        state.count_rejected(decoded)
    assert state.rejected_lines == {
        "malformed_json": 1,
        "not_object": 1,
        "missing_field": 1,
        "not_utf8": 1,
    }


def test_decimation_keeps_extremes_and_fits_width() -> None:
    points = [(float(i), float(i % 7)) for i in range(10_000)]
    points[4321] = (4321.0, 1000.0)
    points[8765] = (8765.0, -50.0)
    out = decimate(points, 80)
    assert len(out) <= 80
    ys = [y for _, y in out]
    assert max(ys) == 1000.0 and min(ys) == -50.0
    xs = [x for x, _ in out]
    assert xs == sorted(xs)
    assert decimate(points[:5], 80) == points[:5]
    with pytest.raises(ValueError, match="width"):
        decimate(points, 0)


def test_series_names_and_unknown_series() -> None:
    state = RunState()
    state.apply(run_start())
    state.apply(gpu(1))
    assert "gpu0.util" in state.series_names()
    assert state.series("gpu3.util", 10) == []
    with pytest.raises(KeyError, match="bogus"):
        state.series("bogus", 10)


def test_applies_200k_history_lines_within_bounds() -> None:
    # Its speed is a benchmark (bench/state_apply.py), not an assertion here.
    # Built directly (decoding is not what is measured here), sharing field dicts.
    step_fields = dict(step(1, 1).fields)
    gpu_fields = dict(gpu(1).fields)
    lines = [run_start()]
    for i in range(1, 200_001):
        kind = i % 10
        if kind < 7:
            fields = {**step_fields, "step": i}
            lines.append(StatusLine(1, i, 1000.0 + i, "r1", "step", fields))
        elif kind < 9:
            lines.append(StatusLine(1, i, 1000.0 + i, "r1", "gpu", gpu_fields))
        else:
            lines.append(StatusLine(1, i, 1000.0 + i, "r1", "heartbeat", {}))
    state = RunState()
    for decoded in lines:
        state.apply(decoded)
    assert state.step == 200_000 and state.lines_applied == 200_001
    assert len(state.series("loss", 120)) <= 120


def _progress(seq: int, t: float, done: int, tokens: int, average: float) -> StatusLine:
    return line(
        "prepare", seq, t=t, prompts_done=done, prompts_total=100, answers_done=done,
        answers_total=100, answer_tokens=tokens, tokens_per_s=average, truncated=0,
        eta_s=None, devices=[],
    )  # fmt: skip


def test_a_prepares_rate_now_spans_its_newest_ten_seconds_of_lines() -> None:
    """The lines' tokens_per_s is the average since generation began; the throughput pane's
    'now' and its plot are the rate over the newest PREPARE_RATE_WINDOW_S (10 s) of lines,
    against answer tokens: between two lines it swings with the batches."""
    state = RunState()
    state.apply(run_start(mode="prepare"))
    state.apply(_progress(1, 1000.0, 10, 4_000, 400.0))
    assert state.prepare_rate == 400.0  # the first line: its own average
    state.apply(_progress(2, 1002.0, 10, 4_000, 400.0))
    assert state.prepare_rate == 0.0  # a chunk being written: nothing new yet
    state.apply(_progress(3, 1004.0, 30, 14_000, 500.0))
    assert state.prepare_rate == 2_500.0  # 10,000 tokens in the 4 s since the first
    state.apply(_progress(4, 1012.0, 40, 30_000, 600.0))
    # The window reaches back to the newest line at least 10 s old (t=1002), no further.
    assert state.prepare_rate == 2_600.0  # 26,000 tokens in 10 s
    state.apply(_progress(5, 1012.0, 40, 30_000, 600.0))
    assert state.prepare_rate == 2_600.0  # the same moment again: the same rate
    view = state.history.view("prepare_tok_s", None, 80)
    assert view.xs == [4_000, 14_000, 30_000] and view.highs == [400.0, 2_500.0, 2_600.0]
    # The count went back (the prepare started again): its own average, not a negative rate.
    state.apply(_progress(6, 1020.0, 35, 2_000, 250.0))
    assert state.prepare_rate == 250.0
    state.apply(_progress(7, 1022.0, 36, 3_000, 300.0))
    assert state.prepare_rate == 500.0  # the window starts again at the restart


def test_a_real_h200_prepares_rate_now_is_its_steady_rate() -> None:
    """The stream of a launched prepare on an H200 (bench/results/prepare_launch_h200_
    2026-12-05: 112,000 answers at 69,170 answer tokens/s on average): between two lines
    the rate went from 0 to ~92,000; over 10 s of lines it stays near the average."""
    stream = Path(__file__).parents[2] / "bench/results/prepare_launch_h200_2026-12-05"
    state = RunState()
    pairs: list[float] = []
    steady: list[float] = []
    previous = None
    lines = (stream / "status.jsonl").read_text().splitlines()
    started = json.loads(lines[0])["t"]
    for text in lines:
        decoded = protocol.decode_line(text)
        assert isinstance(decoded, StatusLine)
        state.apply(decoded)
        if decoded.kind != "prepare":
            continue
        if previous is not None and decoded.t > previous.t:
            tokens = decoded["answer_tokens"] - previous["answer_tokens"]
            pairs.append(tokens / (decoded.t - previous.t))
        previous = decoded
        if decoded.t - started >= 30 and state.prepare_rate is not None:
            steady.append(state.prepare_rate)
    assert min(pairs) == 0.0 and max(pairs) > 90_000  # what the last two lines gave
    assert len(steady) > 100
    assert all(55_000 < rate < 80_000 for rate in steady), (min(steady), max(steady))


def test_a_prepares_gpu_history_spans_the_whole_run() -> None:
    """A prepare has no steps: its GPU readings still draw the whole run against time (they
    were merged into the newest one, all at step 0). The H200 prepare's 62 readings."""
    stream = Path(__file__).parents[2] / "bench/results/prepare_launch_h200_2026-12-05"
    state = RunState()
    for text in (stream / "status.jsonl").read_text().splitlines():
        state.apply(protocol.decode_line(text))
    readings = [json.loads(x) for x in (stream / "status.jsonl").read_text().splitlines()]
    times = [r["t"] for r in readings if r["kind"] == "gpu"]
    view = state.gpu_view(0, "util", None, 120)
    assert len(view.xs) == len(times) == 62
    assert (view.xs[0], view.xs[-1]) == (times[0], times[-1])


def test_a_prepare_cut_short_says_what_it_left() -> None:
    """A prepare stopped by --max-seconds ends `completed` like a whole one: the events pane
    says how many answers it made and how many it left."""
    state = RunState()
    state.apply(run_start(mode="prepare"))
    end = {"reason": "completed", "exit_code": 0, "mode": "prepare", "samples": 8}
    state.apply(line("run_end", 1, **end, unanswered=16, answer_tokens_per_s=5.9))
    assert state.events[-1].text == ("run ended: completed (exit 0): 8 answered, 16 not answered")
    whole = RunState()
    whole.apply(run_start(mode="prepare"))
    whole.apply(line("run_end", 1, **end, unanswered=0, answer_tokens_per_s=5.9))
    assert whole.events[-1].text == "run ended: completed (exit 0)"
