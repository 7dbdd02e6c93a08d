"""The W&B logger's one notice for the status stream: offline without a key on the box (a
real offline wandb run), and says how to upload it later."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dflash_train.pipeline.wandb_log import WandbLogger


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
