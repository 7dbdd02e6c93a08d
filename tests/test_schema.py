"""`dflash-train schema` against protocol.py: every real stream line and reply committed under
bench/results validates, and the schema refuses what decode_line / decode_reply refuse (a
missing field, a wrong type, a bad enum value, a newer version) for every kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from dflash_train import protocol
from dflash_train.stream.schema import document

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = Draft202012Validator(document())
STREAM = Draft202012Validator(document("stream"))
REPLY = Draft202012Validator(document("reply"))
RESULTS = ROOT / "bench" / "results"

SAMPLES: dict[type, Any] = {int: 3, float: 0.5, str: "x", dict: {}, list: [], bool: True}


def _sample(types: tuple[type, ...]) -> Any:
    return SAMPLES[next(t for t in types if t is not type(None))]


def valid_fields(kind: str) -> dict[str, Any]:
    fields = {name: _sample(types) for name, types in protocol.KINDS[kind].items()}
    if kind == "event":
        fields["level"] = "info"
    if kind == "run_end":
        fields["reason"] = "completed"
    if kind == "gpu":
        fields["gpus"] = [{"index": 0, "util": 50.0, "role": "target"}]
    return fields


def line(kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "seq": 4, "t": 1.5, "run": "r1", "kind": kind, **fields}


def agree(record: dict[str, Any]) -> bool:
    """Both sides' verdict on one record; fails the test when they differ."""
    accepted = not isinstance(protocol.decode_line(json.dumps(record)), protocol.Rejected)
    assert STREAM.is_valid(record) == accepted, (record, accepted)
    return accepted


def test_the_schema_is_valid_json_schema() -> None:
    Draft202012Validator.check_schema(document())
    assert set(document()["$defs"]) == {"status_line", "skipped_notice", "reply"}
    kinds = document()["$defs"]["status_line"]["properties"]["kind"]["enum"]
    assert kinds == list(protocol.KINDS)


def test_every_committed_real_stream_line_validates() -> None:
    streams = sorted(RESULTS.rglob("*.status.jsonl"))
    assert len(streams) >= 5
    seen = set()
    for path in streams:
        for text in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(text)
            assert agree(record), (path.name, text[:200])
            seen.add(record["kind"])
    assert {"run_start", "step", "gpu", "event", "checkpoint", "run_end"} <= seen


def test_every_committed_real_reply_validates() -> None:
    replies = [
        json.loads(text)
        for path in sorted(RESULTS.rglob("*.replies.jsonl"))
        for text in path.read_text(encoding="utf-8").splitlines()
    ]
    assert len(replies) >= 5
    for reply in replies:
        assert not isinstance(protocol.decode_reply(json.dumps(reply)), protocol.Rejected)
        assert REPLY.is_valid(reply), reply


@pytest.mark.parametrize("kind", list(protocol.KINDS))
def test_schema_refuses_what_the_decoder_refuses(kind: str) -> None:
    good = valid_fields(kind)
    assert agree(line(kind, **good))
    for name in protocol.KINDS[kind]:
        assert not agree(line(kind, **{k: v for k, v in good.items() if k != name}))
        assert not agree(
            line(kind, **(good | {name: True if str in protocol.KINDS[kind][name] else "x"}))
        )
    assert not agree(line(kind, **good) | {"v": protocol.SCHEMA_VERSION + 1})
    assert not agree(line(kind, **good) | {"seq": -1})
    assert agree(line(kind, **good) | {"detail": "a writer may add fields"})


def test_enums_and_nested_gpu_rows_agree() -> None:
    assert not agree(line("event", **valid_fields("event") | {"level": "loud"}))
    assert not agree(line("run_end", **valid_fields("run_end") | {"reason": "bored"}))
    assert not agree(line("gpu", available=True, gpus=[{"util": 3.0}]))
    assert not agree(line("gpu", available=True, gpus=[{"index": 0, "util": "hot"}]))
    assert not agree(line("nope"))
    assert agree(line("gpu", available=True, gpus=[{"index": 1, "util": None}]))


def test_replies_and_tails_skipped_notice() -> None:
    failed = json.loads(protocol.reply_error("stop", "not_running", "no trainer").to_json())
    assert REPLY.is_valid(failed)
    assert not REPLY.is_valid({k: v for k, v in failed.items() if k != "error_code"})
    assert isinstance(
        protocol.decode_reply(json.dumps({k: v for k, v in failed.items() if k != "error_code"})),
        protocol.Rejected,
    )
    notice = json.loads(protocol.skipped_notice(2 << 20, seq=9, kind="step", run="r1"))
    assert STREAM.is_valid(notice) and not REPLY.is_valid(notice)
    assert VALIDATOR.is_valid(notice) and VALIDATOR.is_valid(failed)


def test_cli_prints_the_generated_document(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "dflash_train.cli", "schema"]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(done.stdout) == document()
    out = tmp_path / "reply.schema.json"
    subprocess.run([*cli, "--only", "reply", "--out", str(out)], check=True, cwd=ROOT)
    assert json.loads(out.read_text()) == document("reply")
    bad = subprocess.run(
        [*cli, "--out", str(tmp_path / "no" / "such" / "dir" / "s.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("dflash-train schema: out: cannot write")
