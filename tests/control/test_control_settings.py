"""Live settings without a trainer: the values in force, and `set`/`restart` refusing bad
input with a one-line reason."""

from __future__ import annotations

from pathlib import Path

from control_harness import cli, run_start_fields, step_fields, write_stream

from dflash_train import protocol
from dflash_train.control.settings import settings_in_force
from dflash_train.rundir import RunDir, atomic_write_json


def test_settings_in_force_follow_the_stream(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    assert settings_in_force(rundir) == protocol.DEFAULT_SETTINGS
    write_stream(rundir.status, "r", [("run_start", run_start_fields()), ("step", step_fields(0))])
    assert settings_in_force(rundir) == {"hs_queue_depth": 8, "hs_min_ready": 2}
    applied = {"level": "info", "message": "ok", "code": "control_applied", "rev": 1}
    applied["settings"] = {"hs_queue_depth": 40, "hs_min_ready": 20}
    write_stream(rundir.status, "r", [("event", applied), ("step", step_fields(1))])
    assert settings_in_force(rundir) == {"hs_queue_depth": 40, "hs_min_ready": 20}


def test_set_needs_a_running_trainer_and_valid_input(tmp_path: Path) -> None:
    rc, reply = cli("set", str(tmp_path), "hs_min_ready", "3")
    assert rc == 1 and reply.error_code == "not_running"
    _, reply = cli("set", str(tmp_path), "hs_min_redy", "3")
    assert reply.error_code == "unknown_setting" and "hs_min_redy" in (reply.error or "")
    _, reply = cli("set", str(tmp_path), "hs_min_ready", "3.5")
    assert reply.error_code == "bad_value" and "integer" in (reply.error or "")
    assert not (tmp_path / "control.json").exists()


def test_restart_refuses_bad_overrides_before_stopping(tmp_path: Path) -> None:
    rc, reply = cli("restart", str(tmp_path))
    assert rc == 1 and reply.error_code == "no_record"
    rundir = RunDir.at(tmp_path)
    atomic_write_json(
        rundir.run_json,
        {"run_id": "r", "train_args": ["--target-model", "random:tiny", "--hs-queue-depth", "8"]},
    )
    cases = [
        (["--set", "hs_min_ready=9"], "hs_min_ready: 9 is out of range 1..hs_queue_depth=8"),
        (["--set", "hs_min_ready=x"], "hs_min_ready: expected an integer"),
        (["--set", "nope=1"], "nope: unknown setting"),
        (["--set", "hs_min_ready"], "is not KEY=VALUE"),
        (["--", "--hs-queue-depth", "1"], "hs_queue_depth: 1 is below hs_min_ready=2"),
    ]
    for args, words in cases:
        rc, reply = cli("restart", str(tmp_path), *args)
        assert rc == 1 and reply.error_code == "bad_override", reply
        assert words in (reply.error or "")
    _, reply = cli("restart", str(tmp_path), "--", "--no-such-option", "1")
    assert reply.error_code == "bad_train_args"
