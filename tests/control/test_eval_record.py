"""Where an evaluation by hand lands: appended to a stopped run's stream (seq continuing,
the run's own id), or through the eval inbox while the run lock is held, which the
trainer's monitor thread writes into the stream; and the `eval` event's fields are checked
like a kind's."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from dflash_train import protocol
from dflash_train.control.eval_record import event_line_fields, record_event
from dflash_train.decode.evaluation import summarize
from dflash_train.decode.heldout_figures import event_fields
from dflash_train.decode.speculative import Generation
from dflash_train.pipeline.monitor import MonitorIntervals, MonitorThread
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.rundir import RunDir, RunLock
from dflash_train.stream.eval_inbox import EvalInbox, inbox_dir
from dflash_train.stream.writer import StatusWriter

FIGURES: dict[str, Any] = {
    "step": 40, "tau": 1.75, "tau_tf": 2.1, "lossless": True, "prompts": 2, "tokens": 16,
    "seconds": 3.5, "source": "manual",
}  # fmt: skip


def _lines(path: Path) -> list[protocol.StatusLine]:
    decoded = [protocol.decode_line(raw) for raw in path.read_bytes().splitlines()]
    assert all(isinstance(line, protocol.StatusLine) for line in decoded), decoded
    return decoded  # type: ignore[return-value]


def _stream(run_dir: RunDir, lines: int = 3) -> StatusWriter:
    writer = StatusWriter(run_dir.status, "r1")
    for step in range(1, lines + 1):
        writer.write("heartbeat", step=step)
    return writer


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"lossless": "yes"}, "event eval.lossless: expected boolean or null, got str"),
        ({"tau": "2"}, "event eval.tau: expected integer or number or null, got str"),
        # null tau is a hybrid target's teacher-forced-only score; with no tau_tf, nothing
        ({"tau": None, "tau_tf": None}, "event eval: tau and tau_tf both null: nothing measured"),
        ({"step": 1.5}, "event eval.step: expected integer, got float"),
        ({"prompts": ...}, "event eval: missing field 'prompts'"),
    ],
)
def test_the_eval_events_fields_are_checked(change: dict[str, Any], reason: str) -> None:
    fields = {"level": "info", "code": "eval", "message": "m", **FIGURES, **change}
    fields = {k: v for k, v in fields.items() if v is not ...}
    with pytest.raises(protocol.EncodeError, match=re.escape(reason)):
        protocol.encode_line("event", seq=0, run="r1", **fields)
    raw = json.dumps({"v": 1, "seq": 0, "t": 1.0, "run": "r1", "kind": "event", **fields})
    rejected = protocol.decode_line(raw)
    assert isinstance(rejected, protocol.Rejected) and rejected.reason == reason
    good = {"level": "info", "code": "eval", "message": "m", **FIGURES, "tau_tf": None}
    decoded = protocol.decode_line(protocol.encode_line("event", seq=0, run="r1", **good))
    assert isinstance(decoded, protocol.StatusLine) and decoded["tau_tf"] is None


def test_a_stopped_runs_stream_gets_the_event_with_seq_continuing(tmp_path: Path) -> None:
    run_dir = RunDir.at(tmp_path / "run")
    _stream(run_dir).close()
    assert record_event(run_dir, FIGURES) == "stream"
    lines = _lines(run_dir.status)
    assert [line.seq for line in lines] == [0, 1, 2, 3]
    event = lines[-1]
    assert event.run == "r1" and event.kind == "event" and event["code"] == "eval"
    assert event["tau"] == 1.75 and event["step"] == 40
    assert event["message"] == (
        "held-out tau 1.750 at step 40 (teacher-forced 2.100), 2 prompts, 3.5 s (by hand)"
    )
    assert not inbox_dir(run_dir).exists()


def test_a_live_run_gets_it_through_the_inbox_and_its_monitor(tmp_path: Path) -> None:
    run_dir = RunDir.at(tmp_path / "run")
    writer = _stream(run_dir)
    monitor = MonitorThread(
        writer,
        block_size=4,
        max_bad_steps=5,
        on_fatal=lambda message: None,
        timers=StageTimers(),
        intervals=MonitorIntervals(tick=0.05, control=0.05, heartbeat=60.0),
        eval_inbox=EvalInbox(run_dir),
    )
    with RunLock(run_dir.lock):  # what a live trainer holds
        assert record_event(run_dir, FIGURES) == "inbox"
        assert record_event(run_dir, {**FIGURES, "step": 50}) == "inbox"
        assert len(list(inbox_dir(run_dir).iterdir())) == 2
        monitor.start()
        deadline = time.monotonic() + 30
        while sum(line.kind == "event" for line in _lines(run_dir.status)) < 2:
            assert time.monotonic() < deadline, "the monitor wrote no eval event"
            time.sleep(0.05)
        monitor.stop()
    writer.close()
    events = [line for line in _lines(run_dir.status) if line.kind == "event"]
    assert [(e["code"], e["step"]) for e in events] == [("eval", 40), ("eval", 50)]
    lines = _lines(run_dir.status)
    assert [line.seq for line in lines] == list(range(len(lines)))  # one writer: no gap
    assert list(inbox_dir(run_dir).iterdir()) == []  # each taken once


def test_a_run_without_a_stream_is_refused(tmp_path: Path) -> None:
    run_dir = RunDir.at(tmp_path / "run")
    run_dir.root.mkdir()
    with pytest.raises(ValueError, match="holds no line to append to"):
        record_event(run_dir, FIGURES)


def test_a_not_lossless_evaluation_says_how_many_outputs_differ() -> None:
    # Two prompts decoded speculatively against plain greedy: the second's second token
    # differs (as a bfloat16 near-tie can make it), the first's are equal.
    spec = [Generation((1, 2, 3), 2, (2, 1)), Generation((4, 5), 2, (1, 1))]
    plain = [Generation((1, 2, 3), 4), Generation((4, 6), 3)]
    fields = event_fields(summarize(spec, plain, 16), [], None, 8) | {"step": 7, "seconds": 1.0}
    assert (fields["lossless"], fields["mismatched"], fields["prompts"]) == (False, 1, 2)
    line = event_line_fields(fields)
    assert (
        line["message"]
        == "held-out tau 1.250 at step 7; NOT lossless (1 of 2 differ), 2 prompts, 1.0 s"
    )
    protocol.encode_line("event", seq=0, run="r1", **line)  # a valid event line
    # An older trainer's event has no count: the message says only that.
    older = event_line_fields({k: v for k, v in fields.items() if k != "mismatched"})
    assert "; NOT lossless, 2 prompts" in older["message"]
    # Lossless: no count, whatever the field says.
    equal = event_fields(summarize(spec[:1], plain[:1], 16), [], None, 8)
    assert equal["mismatched"] == 0
    assert "lossless" not in event_line_fields(equal | {"step": 7, "seconds": 1.0})["message"]
