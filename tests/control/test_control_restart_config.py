"""Restart from the run directory's recorded config: any option may be overridden
(`--set epochs=8`), the whole new config is checked before anything stops, the reply lists
what changed, and the trainer resumes with the changed options."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_train.config.cli_options import resolve_train_args
from dflash_train.control.run_config import (
    OverrideError,
    changed_options,
    override_values,
    recorded_config,
    restarted_config,
    write_run_config,
)
from dflash_train.rundir import RunDir

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
