"""The `prepare` line's ETA (from the answer rate, never past `--max-seconds`' end), and
devices a prepare leaves idle, said."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from train_process import status_lines

from dflash_train.data.prepare import _warn_idle_devices
from dflash_train.data.prepare_progress import PrepareProgress
from dflash_train.stream.writer import StatusWriter


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


def test_fewer_chunks_than_devices_is_said_on_stderr_and_in_the_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A chunk is one worker's unit (its size decides the samples): 560 prompts in one chunk
    of 4,096 kept the second of two workers idle for a whole prepare, unsaid."""
    writer = StatusWriter(tmp_path / "status.jsonl", "r1")
    with caplog.at_level(logging.WARNING, logger="dflash_train.data.prepare"):
        _warn_idle_devices(("cuda:0", "cuda:1", "cuda:2"), 1, 560, writer)
        _warn_idle_devices(("cuda:0", "cuda:1"), 2, 560, writer)  # each has one: nothing said
        _warn_idle_devices(("cuda:0",), 0, 0, writer)  # one device: nothing said
    writer.close()
    said = (
        "devices: 1 chunk of work for 3 devices, so 2 will have nothing to do; a smaller "
        "--chunk-size spreads the 560 prompts left over more of them"
    )
    assert [r.getMessage() for r in caplog.records] == [said]
    events = [line for line in status_lines(tmp_path) if line.kind == "event"]
    assert [(e["level"], e["code"], e["message"]) for e in events] == [
        ("warning", "idle_devices", said)
    ]
