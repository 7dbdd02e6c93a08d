"""ControlWatcher: each new revision of control.json is applied or rejected exactly once."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_train import protocol
from dflash_train.pipeline.control_watch import ControlWatcher, read_control_rev
from dflash_train.pipeline.pool import HiddenStatePool
from dflash_train.rundir import atomic_write_text


def _write(path: Path, rev: int, **settings: int) -> None:
    atomic_write_text(path, protocol.ControlFile(rev, settings).to_json())


def _watcher(path: Path, pool: HiddenStatePool[int], baseline: int | None) -> ControlWatcher:
    def apply(updates: dict[str, int]) -> None:
        merged = {**pool.limits, **updates}
        pool.set_limits(depth=merged["hs_queue_depth"], min_ready=merged["hs_min_ready"])

    return ControlWatcher(path, current=lambda: pool.limits, apply=apply, baseline_rev=baseline)


def test_new_revisions_apply_to_the_pool_once(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=2)
    watcher = _watcher(path, pool, baseline=None)
    assert watcher.poll() is None  # no file yet
    _write(path, 1, hs_min_ready=6)
    outcome = watcher.poll()
    assert outcome is not None and outcome.applied and outcome.rev == 1
    assert outcome.message == "hs_min_ready=6"
    assert pool.limits == {"hs_queue_depth": 8, "hs_min_ready": 6}
    assert watcher.poll() is None  # same revision: no second answer
    _write(path, 2, hs_queue_depth=90, hs_min_ready=30)
    outcome = watcher.poll()
    assert outcome is not None and outcome.applied
    assert outcome.settings == {"hs_queue_depth": 90, "hs_min_ready": 30}


def test_invalid_values_are_rejected_with_reason_and_nothing_changes(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=2)
    watcher = _watcher(path, pool, baseline=None)
    _write(path, 3, hs_min_ready=50)
    outcome = watcher.poll()
    assert outcome is not None and not outcome.applied and outcome.rev == 3
    assert "hs_min_ready" in outcome.message and "out of range" in outcome.message
    assert pool.limits == {"hs_queue_depth": 8, "hs_min_ready": 2}
    path.write_text("{not json", encoding="utf-8")
    outcome = watcher.poll()
    assert outcome is not None and outcome.rev is None and "malformed" in outcome.message


def test_revisions_from_before_the_trainer_started_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    _write(path, 7, hs_min_ready=5)
    assert read_control_rev(path) == 7
    pool: HiddenStatePool[int] = HiddenStatePool(depth=8, min_ready=2)
    watcher = _watcher(path, pool, baseline=read_control_rev(path))
    assert watcher.poll() is None and pool.limits["hs_min_ready"] == 2
    _write(path, 8, hs_min_ready=5)
    # Same size and maybe the same mtime tick: force a visible change for the stat check.
    os.utime(path, ns=(1, 1))
    outcome = watcher.poll()
    assert outcome is not None and outcome.applied and pool.limits["hs_min_ready"] == 5
