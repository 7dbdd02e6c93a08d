"""Restart from the run directory's recorded config: any option may be overridden
(`--set epochs=8`), the whole new config is checked before anything stops, the reply lists
what changed and the live values it carried over (set on the box, over the launch's own
arguments), and the trainer resumes with them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from control_harness import cli, decode_all, dflash_argv, trainer_env_args

from dflash_train import protocol
from dflash_train.config.cli_options import resolve_train_args
from dflash_train.config.recipes import CPU_TINY
from dflash_train.control.run_config import (
    OverrideError,
    changed_options,
    override_values,
    recorded_config,
    restarted_config,
    write_run_config,
)
from dflash_train.rundir import RunDir, lock_is_held, read_json

BASE = ["--target-model", "random:tiny", "--data-dir", "d", "--hs-queue-depth", "8"]


def _base(tmp_path: Path):  # type: ignore[no-untyped-def]
    return resolve_train_args(BASE, environ={}, output_dir=str(tmp_path))


def test_overrides_of_any_option_are_applied_to_the_record_and_listed(tmp_path: Path) -> None:
    rundir = RunDir.at(tmp_path)
    write_run_config(rundir, _base(tmp_path))
    base = recorded_config(rundir, {}, {})
    assert base.config.train.target_model == "random:tiny"
    overrides = override_values(
        {"lr": "1e-4", "epochs": "8", "max_steps": "200000"}, ["--hs-min-ready", "4"]
    )
    new = restarted_config(
        base, overrides, environ={"DFLASH_STALL_AFTER": "90"}, owned={"resume_from": "latest"}
    )
    config = new.config
    assert (config.optimiser.lr, config.optimiser.epochs, config.optimiser.max_steps) == (
        1e-4,
        8,
        200000,
    )
    assert config.live_settings() == {"hs_queue_depth": 8, "hs_min_ready": 4}
    assert new.sources["epochs"] == "set" and new.sources["target_model"] == "cli"
    assert new.sources["stall_after"] == "env:DFLASH_STALL_AFTER"
    assert changed_options(new, base) == {
        "epochs": {"from": 6, "to": 8},
        "max_steps": {"from": None, "to": 200000},
        "lr": {"from": 6e-4, "to": 1e-4},
        "stall_after": {"from": 300.0, "to": 90.0},
        "hs_min_ready": {"from": None, "to": 4},
    }


@pytest.mark.parametrize(
    ("sets", "extra", "code", "words"),
    [
        ({"epochs": "0"}, [], "bad_override", "epochs (--set): 0 is out of range 1.."),
        ({"lr": "fast"}, [], "bad_override", "lr (--set): expected a number"),
        ({"colour": "blue"}, [], "bad_override", "colour: unknown setting"),
        ({"run_id": "x"}, [], "bad_override", "run_id: set by restart itself"),
        ({"hs_min_ready": "9"}, [], "bad_override", "out of range 1..hs_queue_depth=8"),
        ({}, ["--hs-queue-depth", "1"], "bad_override", "hs_queue_depth: 1 is below hs_min_ready"),
        ({}, ["--no-such-option", "1"], "bad_train_args", "--no-such-option"),
        ({}, ["--config", "x.toml"], "bad_train_args", "not an override"),
    ],
)
def test_bad_overrides_are_refused_by_name(
    tmp_path: Path, sets: dict[str, str], extra: list[str], code: str, words: str
) -> None:
    base = _base(tmp_path)
    base = restarted_config(base, {"hs_min_ready": "2"}, environ={}, owned={})
    with pytest.raises(OverrideError) as caught:
        restarted_config(base, override_values(sets, extra), environ={}, owned={})
    assert caught.value.code == code and words in str(caught.value), caught.value


def test_a_run_launched_before_configs_were_recorded_restarts_from_its_args(
    tmp_path: Path,
) -> None:
    rundir = RunDir.at(tmp_path)
    recorded = recorded_config(rundir, {"train_args": [*BASE, "--epochs", "3"]}, {})
    assert recorded.config.optimiser.epochs == 3
    assert recorded.config.train.output_dir == str(rundir.root)


# A randomly initialised tiny target keeps the starts quick; what is checked is which
# options a restart applies, not what the drafter learns.
TINY_RUN = [
    "--target-model", "random:tiny", *CPU_TINY.argv(), "--pipeline", "sync",
    "--epochs", "1000", "--save-every", "3", "--warmup-ratio", "0",
]  # fmt: skip


def _lines(run_dir: Path) -> list[protocol.StatusLine]:
    return decode_all((run_dir / "status.jsonl").read_bytes())


def _wait(run_dir: Path, done: Callable[[list[protocol.StatusLine]], bool], what: str) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if (run_dir / "status.jsonl").exists() and done(_lines(run_dir)):
            return
        time.sleep(0.3)
    raise AssertionError(f"no {what} after 180 s")


def _term_pending(pid: int) -> bool:
    """SIGTERM sent to the process and not yet acted on (it is stopped): its bit in the
    shared pending set of /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def _restart_while_frozen(pid: int, *args: str) -> tuple[int, protocol.Reply]:
    """`restart ARGS` of a trainer whose process group is SIGSTOPped: it is woken (SIGCONT)
    once the restart's SIGTERM is pending, so it stops at the step it was frozen at, however
    long the restart took to get there."""
    proc = subprocess.Popen(dflash_argv("restart", *args), stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _term_pending(pid) and proc.poll() is None:
            assert time.monotonic() < deadline, "the restart sent no SIGTERM in 120 s"
            time.sleep(0.05)
    finally:
        os.killpg(pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=240)
    reply = protocol.decode_reply(out)
    assert isinstance(reply, protocol.Reply), out
    return proc.returncode, reply


def test_restart_set_applies_any_option_on_resume_and_refuses_before_stopping(
    run_dirs: Callable[[str], Path], prepared_data_dir: Path
) -> None:
    run_dir = run_dirs("run")
    rc, launched = cli(
        "launch", str(run_dir), "--wait", "180", *trainer_env_args(), "--",
        *TINY_RUN, "--data-dir", str(prepared_data_dir), "--hs-min-ready", "3", timeout=240,
    )  # fmt: skip
    assert rc == 0 and launched.ok, launched
    # The trainer runs exactly what the run dir records.
    record = read_json(run_dir / "run.json")
    assert record["argv"][-2:] == ["--config", str(run_dir / "config.json")]
    recorded = read_json(run_dir / "config.json")
    assert recorded["config"]["optimiser"]["epochs"] == 1000
    assert recorded["config"]["run"]["run_id"] == launched.data["run_id"]
    assert recorded["sources"]["epochs"] == "cli" and recorded["sources"]["seed"] == "default"
    _wait(run_dir, lambda ls: any(x.kind == "checkpoint" for x in ls), "checkpoint")
    pid = launched.data["pid"]
    # Frozen while nothing needs it to run, so how far it gets does not hang on how fast
    # this machine is (the steps bound max_steps below).
    os.killpg(pid, signal.SIGSTOP)

    # Refused before anything stops: a bad value, and a shape the checkpoint cannot take.
    for sets, code, words in (
        (["epochs=0"], "bad_override", "epochs (--set): 0 is out of range 1.."),
        (["block_size=8"], "incompatible_checkpoint", "block_size: checkpoint"),
    ):
        rc, refused = cli("restart", str(run_dir), *(f"--set={s}" for s in sets), timeout=120)
        assert rc == 1 and refused.error_code == code and words in (refused.error or ""), refused
        assert lock_is_held(run_dir / "run.lock") and read_json(run_dir / "run.json")["pid"] == pid
    assert read_json(run_dir / "config.json") == recorded
    # A value set live survives the restart, over the launch's explicit --hs-min-ready 3
    # (the trainer answers a set: it runs for it, then is frozen again).
    os.killpg(pid, signal.SIGCONT)
    rc, live = cli("set", str(run_dir), "hs_min_ready", "5", timeout=120)
    assert rc == 0 and live.ok, live
    os.killpg(pid, signal.SIGSTOP)

    # A max_steps past the step the trainer is frozen at: it ends that step and checkpoints
    # when the restart's SIGTERM wakes it (its step lines may trail by a step or two).
    reached = max(x["step"] for x in _lines(run_dir) if x.kind == "step")
    most = reached + 10
    rc, back = _restart_while_frozen(
        pid, str(run_dir), "--wait", "180",
        "--set", "epochs=20", "--set", "lr=1e-4", "--set", f"max_steps={most}",
    )  # fmt: skip
    assert rc == 0 and back.ok, back
    assert back.data["resumed_from"] and back.data["run_id"] == launched.data["run_id"]
    assert back.data["changed"] == {
        "epochs": {"from": 1000, "to": 20},
        "max_steps": {"from": None, "to": most},
        "lr": {"from": 6e-4, "to": 1e-4},
    }
    changed = f"; changed epochs 1000→20, max_steps unset→{most}, lr 0.0006→0.0001"
    assert changed in back.data["message"]
    assert back.data["carried"] == {"hs_min_ready": {"from": 3, "to": 5}}
    assert "; kept live hs_min_ready 5 (recorded 3)" in back.data["message"]
    assert back.data["train_args"][-2:] == ["--resume-from", "latest"]
    again = read_json(run_dir / "config.json")
    assert again["config"]["optimiser"]["epochs"] == 20 and again["sources"]["epochs"] == "set"
    _wait(run_dir, lambda ls: ls[-1].kind == "run_end", "run_end")
    lines = _lines(run_dir)
    starts = [i for i, line in enumerate(lines) if line.kind == "run_start"]
    first, resumed = lines[starts[0]], lines[starts[-1]]
    assert resumed["resumed_from"] == back.data["resumed_from"]
    assert 0 < resumed["start_step"] < most, "stopped too late to see the new max_steps"
    assert (resumed["config"]["epochs"], resumed["config"]["lr"]) == (20, 1e-4)
    assert resumed["config"]["hs_min_ready"] == 5 and again["sources"]["hs_min_ready"] == "live"
    # The schedule ends at max_steps, well inside 20 epochs. (Not "whichever comes first"
    # with 7: epochs differ by a batch or two, as buckets are cut afresh each epoch, so 7
    # epochs are not 7 x the first one's batches; a quiet CI reached far enough for that
    # bound to bind and read 44 steps against 42.)
    assert most < 10 * first["batches_per_epoch"]
    assert resumed["total_steps"] == most and first["total_steps"] > most
    # The new peak lr is the one trained with (the checkpoint carried the old one).
    before = [x["lr"] for x in lines[starts[0] : starts[-1]] if x.kind == "step"]
    after = [x["lr"] for x in lines[starts[-1] :] if x.kind == "step"]
    assert before and min(before) > 1e-4 and after and max(after) <= 1e-4
    end = lines[-1]
    assert (end["reason"], end["step"]) == ("completed", most)
