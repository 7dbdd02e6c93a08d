"""The stream stays alive while the trainer compiles before its first step. The monitor
thread starts with the training loop; on the H200 a warm-up of 135 s wrote nothing after
run_start and `status` called the launch stalled. The trainer runs for real here, in this
process, with its warm-up held until the stream has beaten."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from train_process import TINY, status_lines

from dflash_train.config import load_config
from dflash_train.config.cli_options import add_option_arguments, given_options
from dflash_train.stream.beat import Beat
from dflash_train.stream.writer import StatusWriter
from dflash_train.training import run as run_module
from dflash_train.training.process import train


def _beat_after_run_start(run_dir: Path) -> bool:
    kinds = [line.kind for line in status_lines(run_dir)]
    return "run_start" in kinds and "heartbeat" in kinds[kinds.index("run_start") :]


def test_the_stream_beats_while_the_trainer_compiles_before_its_first_step(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    real_compile = run_module.compile_before_workers
    held: dict[str, bool] = {}

    def slow_compile(**kwargs: Any) -> dict[str, Any]:
        # A compile of minutes, as on the GPU: it ends once the stream has beaten.
        deadline = time.monotonic() + 60
        while not _beat_after_run_start(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        held["beat"] = _beat_after_run_start(run_dir)
        return real_compile(**kwargs)

    monkeypatch.setattr(run_module, "compile_before_workers", slow_compile)
    monkeypatch.setattr(run_module, "WARM_UP_BEAT_S", 0.2)
    parser = argparse.ArgumentParser()
    add_option_arguments(parser)
    argv = ["--target-model", smollm2_spec, "--data-dir", str(prepared_data_dir)]
    argv += ["--output-dir", str(run_dir), *TINY, "--max-steps", "2", "--save-every", "0"]
    config = load_config(given_options(parser.parse_args(argv))).config
    assert train(config) == 0
    assert held["beat"], "no heartbeat while the warm-up ran"
    kinds = [line.kind for line in status_lines(run_dir)]
    assert kinds.index("heartbeat") < kinds.index("step") < kinds.index("run_end")
    assert not any(t.name == "warm-up-beat" for t in threading.enumerate())


def test_a_beat_falls_silent_after_its_limit(tmp_path: Path) -> None:
    writer = StatusWriter(tmp_path / "status.jsonl", "r1")
    beat = Beat(writer, {}, every=0.05, limit=0.5).start()
    beat._thread.join(timeout=30)  # it ends by itself at its limit
    assert not beat._thread.is_alive()
    beats = [line for line in status_lines(tmp_path) if line.kind == "heartbeat"]
    assert 1 <= len(beats) <= 10  # one a beat at most, none past the limit
    beat.stop()
    writer.close()
