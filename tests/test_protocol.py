"""The status-stream and control-reply schema: round trips, and bad lines rejected with a reason."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflash_train import protocol as p

GOOD_FIELDS: dict[str, dict] = {
    "run_start": {
        "config": {"lr": 6e-4},
        "topology": {"target": ["cpu"], "drafter": ["cpu"]},
        "dataset": {"samples": 10},
        "batches_per_epoch": 4,
        "total_steps": 8,
        "pid": 123,
        "host": "box",
    },
    "step": {
        "step": 3,
        "epoch": 0,
        "epoch_progress": 0.75,
        "loss": 2.5,
        "acc": 0.4,
        "tau": 1.7,
        "lr": 1e-4,
        "grad_norm": 0.9,
        "tokens": 4096,
        "ktok_s": 12.5,
    },
    "queue": {
        "hs_ready": 3,
        "hs_queue_depth": 8,
        "hs_min_ready": 2,
        "producer_wait": 0.1,
        "consumer_wait": 0.0,
        "starved": 0.02,
        "bucket_mix": {"0": 2, "1": 1},
    },
    "gpu": {
        "available": True,
        "gpus": [{"index": 0, "role": "target", "util": 97.0, "power_w": 610.5, "temp_c": 61}],
    },
    "profile": {"stages_ms": {"target_fwd": 12.0}, "allocator": {"reserved": 1 << 30}},
    "event": {"level": "info", "message": "hs_min_ready=30", "code": "control_applied"},
    "checkpoint": {"step": 100, "path": "checkpoints/step_0000100", "seconds": 1.5},
    "heartbeat": {},
    "prepare": {
        "prompts_done": 4096,
        "prompts_total": 900000,
        "answers_done": 4096,
        "answers_total": 900000,
        "answer_tokens": 1048576,
        "tokens_per_s": 21000.5,
        "truncated": 12,
        "eta_s": None,
        "devices": [{"device": "cuda:0", "tokens_per_s": 21000.5, "batch_size": 1024}],
    },
    "run_end": {"reason": "completed", "exit_code": 0},
}


def test_every_kind_has_a_sample() -> None:
    assert set(GOOD_FIELDS) == set(p.KINDS)


@pytest.mark.parametrize("kind", sorted(p.KINDS))
def test_round_trip_every_kind(kind: str) -> None:
    line = p.encode_line(kind, seq=7, run="abc123", t=1000.5, **GOOD_FIELDS[kind])
    assert line.endswith("\n") and line.count("\n") == 1
    decoded = p.decode_line(line)
    assert isinstance(decoded, p.StatusLine), decoded
    assert (decoded.v, decoded.seq, decoded.t, decoded.run, decoded.kind) == (
        1,
        7,
        1000.5,
        "abc123",
        kind,
    )
    assert dict(decoded.fields) == GOOD_FIELDS[kind]
    # bytes in, same record out
    assert p.decode_line(line.encode()) == decoded


def test_non_finite_metrics_become_null() -> None:
    fields = dict(GOOD_FIELDS["step"], loss=float("nan"), grad_norm=float("inf"))
    decoded = p.decode_line(p.encode_line("step", seq=0, run="r", **fields))
    assert isinstance(decoded, p.StatusLine)
    assert decoded["loss"] is None and decoded["grad_norm"] is None


def test_extra_fields_are_kept() -> None:
    line = p.encode_line("event", seq=0, run="r", rev=4, **GOOD_FIELDS["event"])
    decoded = p.decode_line(line)
    assert isinstance(decoded, p.StatusLine) and decoded["rev"] == 4


def test_encoder_refuses_bad_records() -> None:
    with pytest.raises(p.EncodeError):
        p.encode_line("nope", seq=0, run="r")
    with pytest.raises(p.EncodeError):
        p.encode_line("checkpoint", seq=0, run="r", step=1, path="x")  # no seconds
    with pytest.raises(p.EncodeError):
        p.encode_line("heartbeat", seq=0, run="r", v=2)


def _line(**overrides: object) -> str:
    record = {"v": 1, "seq": 1, "t": 1.0, "run": "r", "kind": "step", **GOOD_FIELDS["step"]}
    for key, value in overrides.items():
        if value is _DROP:
            record.pop(key)
        else:
            record[key] = value
    return json.dumps(record)


_DROP = object()

BAD_LINES: list[tuple[str, str | bytes, str]] = [
    ("empty", "", "empty"),
    ("blank", "   \n", "empty"),
    ("truncated json", _line()[:-9], "malformed_json"),
    ("not json", "hello world", "malformed_json"),
    ("trailing garbage", _line() + "}", "malformed_json"),
    ("NaN literal", _line().replace('"loss": 2.5', '"loss": NaN'), "malformed_json"),
    ("array", "[1, 2, 3]", "not_object"),
    ("string", '"step"', "not_object"),
    ("number", "42", "not_object"),
    ("binary garbage", b"\xff\xfe\x00\x81garbage", "not_utf8"),
    ("huge line", "x" * (p.MAX_LINE_BYTES + 1), "too_long"),
    ("huge bytes", b"{" + b" " * (p.MAX_LINE_BYTES + 1), "too_long"),
    ("deep nesting", "[" * 100_000 + "]" * 100_000, "malformed_json"),
    ("missing v", _line(v=_DROP), "missing_field"),
    ("missing seq", _line(seq=_DROP), "missing_field"),
    ("missing run", _line(run=_DROP), "missing_field"),
    ("missing kind", _line(kind=_DROP), "missing_field"),
    ("seq is string", _line(seq="1"), "wrong_type"),
    ("seq is bool", _line(seq=True), "wrong_type"),
    ("seq is float", _line(seq=1.5), "wrong_type"),
    ("negative seq", _line(seq=-1), "bad_value"),
    ("t is string", _line(t="now"), "wrong_type"),
    ("run is number", _line(run=5), "wrong_type"),
    ("newer schema", _line(v=2), "newer_version"),
    ("schema zero", _line(v=0), "bad_value"),
    ("unknown kind", _line(kind="telemetry"), "unknown_kind"),
    ("step missing loss", _line(loss=_DROP), "missing_field"),
    ("step loss string", _line(loss="2.5"), "wrong_type"),
    ("step step float", _line(step=3.0), "wrong_type"),
    ("step tokens bool", _line(tokens=False), "wrong_type"),
    (
        "event bad level",
        json.dumps({"v": 1, "seq": 0, "t": 1, "run": "r", "kind": "event"} | {
            "level": "fatal", "message": "x", "code": "c"}),
        "bad_value",
    ),
    (
        "run_end bad reason",
        json.dumps({"v": 1, "seq": 0, "t": 1, "run": "r", "kind": "run_end"} | {
            "reason": "bored", "exit_code": 0}),
        "bad_value",
    ),
    (
        "gpu entry not object",
        json.dumps({"v": 1, "seq": 0, "t": 1, "run": "r", "kind": "gpu"} | {
            "available": True, "gpus": [3]}),
        "wrong_type",
    ),
    (
        "gpu util string",
        json.dumps({"v": 1, "seq": 0, "t": 1, "run": "r", "kind": "gpu"} | {
            "available": True, "gpus": [{"index": 0, "util": "97%"}]}),
        "wrong_type",
    ),
    (
        "gpu missing index",
        json.dumps({"v": 1, "seq": 0, "t": 1, "run": "r", "kind": "gpu"} | {
            "available": True, "gpus": [{"util": 1.0}]}),
        "missing_field",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "raw", "code"), BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_lines_are_rejected_with_a_reason(name: str, raw: str | bytes, code: str) -> None:
    result = p.decode_line(raw)
    assert isinstance(result, p.Rejected), f"{name} was accepted"
    assert result.code == code, result
    assert result.reason and "\n" not in result.reason


def test_more_than_twenty_kinds_of_bad_line() -> None:
    assert len({code for _, _, code in BAD_LINES}) >= 10
    assert len(BAD_LINES) >= 20


def test_settings_validation() -> None:
    assert p.validate_settings({"hs_min_ready": "30"}, {"hs_queue_depth": 90}) == {
        "hs_min_ready": 30
    }
    # judged as a pair: raising depth makes room for a larger min-ready
    assert p.validate_settings({"hs_queue_depth": "90", "hs_min_ready": "30"}, {}) == {
        "hs_queue_depth": 90,
        "hs_min_ready": 30,
    }
    cases = {
        ("hs_min_ready", "abc"): "expected an integer",
        ("hs_min_ready", "3.5"): "expected an integer",
        ("hs_min_ready", "0"): "out of range",
        ("hs_min_ready", "-4"): "out of range",
        ("hs_min_ready", "91"): "out of range 1..hs_queue_depth=90",
        ("hs_min_ready", "9" * 40): "out of range",
        ("hs_queue_depth", "10"): "below hs_min_ready=30",
        ("queue_size", "3"): "unknown setting",
    }
    for (key, value), message in cases.items():
        with pytest.raises(p.SettingError) as err:
            p.validate_settings({key: value}, {"hs_queue_depth": 90, "hs_min_ready": 30})
        assert message in str(err.value)
        assert str(err.value).startswith(key)
    with pytest.raises(p.SettingError):
        p.parse_setting_value("hs_min_ready", True)  # type: ignore[arg-type]


def test_control_file_round_trip_and_rejects() -> None:
    text = p.ControlFile(rev=3, settings={"hs_min_ready": 5}).to_json()
    decoded = p.decode_control(text)
    assert decoded == p.ControlFile(3, {"hs_min_ready": 5})
    for bad in ("{", "[]", '{"rev": "1", "settings": {}}', '{"rev": 1, "settings": []}'):
        assert isinstance(p.decode_control(bad), p.Rejected)
    assert isinstance(p.decode_control('{"rev": 1, "settings": {"x": 1}}'), p.Rejected)
    assert isinstance(p.decode_control('{"rev": 1, "settings": {"hs_min_ready": "5"}}'), p.Rejected)


def test_replies_round_trip() -> None:
    ok = p.reply_ok("launch", pid=42, run_id="abc")
    assert p.decode_reply(ok.to_json()) == ok
    err = p.reply_error("set", "out_of_range", "hs_min_ready: 0 is out of range 1..8")
    assert p.decode_reply(err.to_json().encode()) == err
    # progress noise before the reply is tolerated: the reply is the last line
    assert p.decode_reply("loading...\n" + ok.to_json() + "\n") == ok
    for bad in ("", "nope", "[]", '{"v": 9, "command": "x", "ok": true}', '{"v": 1, "ok": false}'):
        assert isinstance(p.decode_reply(bad), p.Rejected)
    assert isinstance(p.decode_reply('{"v": 1, "command": "x", "ok": false}'), p.Rejected)


def test_console_side_imports_no_torch() -> None:
    code = (
        "import sys, dflash_train.protocol, dflash_train.stream.writer, dflash_train.rundir;"
        "bad = [m for m in ('torch', 'textual', 'transformers') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_round_shares_of_known_rounds() -> None:
    # Ten rounds: four made 1 token (no draft kept), three 2, two 5, one 9.
    lengths = [4, 3, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert p.round_shares(lengths) == {1: 0.6, 2: 0.3, 4: 0.3, 8: 0.1}
    assert p.round_shares([4, 3, 2, 1], (1, 2, 4)) == {1: 0.6, 2: 0.3}  # block 4: 3 drafts at most
    assert p.round_shares([]) == {}
