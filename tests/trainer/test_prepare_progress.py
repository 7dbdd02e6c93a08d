"""The `prepare` line's ETA: from the answer rate, and never past `--max-seconds`' end."""

from __future__ import annotations

import time

from dflash_train.data.prepare_progress import PrepareProgress


def _one_answer_in_ten_seconds(deadline: float | None) -> PrepareProgress:
    progress = PrepareProgress(1000, 1000, 0, None, deadline)
    sink = progress.worker(0, "cpu")
    sink.tally.started = time.monotonic() - 10.0  # generation began 10 s ago
    progress.add(sink.tally, tokens=50, answers=1)
    return progress


def test_eta_follows_the_answer_rate_without_a_cap() -> None:
    progress = _one_answer_in_ten_seconds(None)
    eta = progress.fields()["eta_s"]
    progress.close()
    # 999 answers left at 0.1 answer/s (a little less, by the time this reads it).
    assert 9990 <= eta <= 999 * 11


def test_eta_stops_at_the_max_seconds_end_where_that_comes_first() -> None:
    progress = _one_answer_in_ten_seconds(time.time() + 30.0)
    eta = progress.fields()["eta_s"]
    progress.close()
    assert 0 < eta <= 30.0


def test_a_cap_already_passed_reads_zero_and_a_finished_prepare_zero() -> None:
    progress = _one_answer_in_ten_seconds(time.time() - 1.0)
    assert progress.fields()["eta_s"] == 0.0
    progress.close()
    done = PrepareProgress(0, 0, 0, None, time.time() + 30.0)
    assert done.fields()["eta_s"] == 0.0
    done.close()
