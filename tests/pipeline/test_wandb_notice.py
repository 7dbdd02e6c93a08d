"""The W&B logger's one notice for the status stream: offline without a key on the box (a
real offline wandb run), and says how to upload it later."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dflash_train.pipeline.wandb_log import WandbLogger, split_tags, wandb_mode


def test_an_offline_run_says_so_and_how_to_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no netrc there: no key on this "box"
    logger = WandbLogger(project="dflash-test", run_dir=tmp_path, run_id="noticerun", config={})
    try:
        deadline = time.monotonic() + 120
        while (notice := logger.take_notice()) is None:
            assert time.monotonic() < deadline, logger.error
            time.sleep(0.1)
    finally:
        logger.close()
    assert notice["code"] == "wandb_offline" and notice["level"] == "info"
    assert f"wandb sync {tmp_path / 'wandb'}" in notice["message"]
    assert logger.take_notice() is None  # once


def _notice(logger: WandbLogger) -> dict[str, object]:
    """The logger's notice, once its run has finished: a loaded machine's wandb can take
    longer than close's 60 s default, and a run file read before then lacks records."""
    try:
        deadline = time.monotonic() + 120
        while (notice := logger.take_notice()) is None:
            assert time.monotonic() < deadline, logger.error
            time.sleep(0.1)
    finally:
        finished = logger.close(timeout=600)
    assert finished, "wandb did not finish its run within 600 s"
    return notice


def test_wandb_mode_offline_wins_over_a_key_and_the_run_carries_entity_name_tags_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.trainer.wandb_records import run_record

    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # a key on the box, never used: offline
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HOME", str(tmp_path))
    logger = WandbLogger(
        project="dflash-test",
        run_dir=tmp_path,
        run_id="moderun",
        config={},
        entity="my-team",
        name="qwen27b-lr3e-4",
        tags=split_tags("qwen27b, sweep ,"),
        group="sweep-1",
    )
    notice = _notice(logger)
    assert notice["code"] == "wandb_offline"
    assert str(notice["message"]).startswith("W&B offline: WANDB_MODE=offline;")
    run = run_record(tmp_path)
    assert (run.entity, run.display_name, run.run_group) == ("my-team", "qwen27b-lr3e-4", "sweep-1")
    assert list(run.tags) == ["qwen27b", "sweep"] and run.run_id == "moderun"


def test_wandb_mode_disabled_logs_nothing_and_a_bad_mode_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    disabled = WandbLogger(project="p", run_dir=tmp_path, run_id="off", config={})
    disabled.log({"train/loss": 1.0}, 1)
    assert _notice(disabled)["code"] == "wandb_disabled"
    assert not list(tmp_path.glob("wandb/*run-*"))
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    bad = _notice(WandbLogger(project="p", run_dir=tmp_path, run_id="bad", config={}))
    assert bad["code"] == "wandb_failed" and bad["level"] == "warning"
    assert bad["message"] == (
        "WANDB_MODE: 'sometimes' is not one of online, offline, disabled, dryrun"
    )


def test_the_mode_follows_the_key_unless_wandb_mode_says_otherwise() -> None:
    assert wandb_mode(None, {}) == "offline"
    assert wandb_mode("netrc", {}) == "online"
    assert wandb_mode("WANDB_API_KEY", {"WANDB_MODE": "dryrun"}) == "offline"
    assert wandb_mode(None, {"WANDB_MODE": "online"}) == "online"
    with pytest.raises(ValueError, match="WANDB_MODE: 'x'"):
        wandb_mode(None, {"WANDB_MODE": "x"})
