"""Helpers for the control-plane tests: run `dflash-train` as a real subprocess, write
synthetic streams with the real status writer, end a trainer a test started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.config.recipes import CPU_TINY
from dflash_train.rundir import RunDir, lock_is_held, read_json
from dflash_train.stream.writer import StatusWriter

# The smallest real training the trainer accepts on SmolLM2: one drafter layer, short
# blocks, tiny batches, so steps take well under a second on a busy 2-core box.
SMALL_TRAIN = [*CPU_TINY.argv(), "--epochs", "1000", "--save-every", "3"]


def dflash_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dflash_train", *args]


def cli(*args: str, timeout: float = 120) -> tuple[int, protocol.Reply]:
    """Run `dflash-train ARGS` as the console would, and decode its one JSON reply."""
    done = subprocess.run(
        dflash_argv(*args),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    reply = protocol.decode_reply(done.stdout)
    assert isinstance(reply, protocol.Reply), (reply, done.stdout, done.stderr[-2000:])
    return done.returncode, reply


def trainer_env_args() -> list[str]:
    """--env options for a launched trainer: one thread (the box is shared), and the model
    cache the session fixtures chose (launch passes no other variable of ours on)."""
    env = ["--env", "OMP_NUM_THREADS=1", "--env", "MKL_NUM_THREADS=1"]
    cache = os.environ.get("DFLASH_CACHE_DIR")
    if cache:
        env += ["--env", f"DFLASH_CACHE_DIR={cache}"]
    return env


def end_trainer(run_dir: Path) -> None:
    """Kill the process group a test's launch recorded, if it still holds the lock."""
    rundir = RunDir.at(run_dir)
    record = read_json(rundir.run_json)
    if not isinstance(record, dict) or not lock_is_held(rundir.lock):
        return
    pgid = record.get("pgid")
    if isinstance(pgid, int) and pgid > 1:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while lock_is_held(rundir.lock) and time.monotonic() < deadline:
        time.sleep(0.1)


def write_stream(
    path: Path, run_id: str, lines: list[tuple[str, dict[str, Any]]], *, t0: float | None = None
) -> int:
    """Append lines through the real StatusWriter; returns the last seq."""
    writer = StatusWriter(path, run_id)
    start = time.time() if t0 is None else t0
    seq = -1
    try:
        for i, (kind, fields) in enumerate(lines):
            seq = writer.write(kind, **{"t": start + i * 0.001, **fields})
    finally:
        writer.close()
    return seq


def step_fields(step: int, loss: float = 1.0) -> dict[str, Any]:
    return {
        "step": step,
        "epoch": 0,
        "epoch_progress": 0.0,
        "loss": loss,
        "acc": 0.5,
        "tau": 2.0,
        "lr": 1e-4,
        "grad_norm": 1.0,
        "tokens": 100,
        "ktok_s": 1.0,
    }


def run_start_fields() -> dict[str, Any]:
    return {
        "config": {},
        "topology": {},
        "dataset": {},
        "batches_per_epoch": 10,
        "total_steps": 100,
        "pid": os.getpid(),
        "host": "test",
        "settings": {"hs_queue_depth": 8, "hs_min_ready": 2},
    }


def decode_all(data: bytes) -> list[protocol.StatusLine]:
    out = []
    for raw in data.splitlines():
        line = protocol.decode_line(raw)
        assert isinstance(line, protocol.StatusLine), (line, raw[:300])
        out.append(line)
    return out


def read_json_file(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def dataset_shell(directory: Path, shards: int = 2) -> Path:
    """The files of a `save_to_disk` dataset with placeholder shard bytes: enough for
    preflight, which checks presence and readability, never contents."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
    state = {"_data_files": [{"filename": name} for name in names], "_split": None}
    (directory / "state.json").write_text(json.dumps(state))
    (directory / "dataset_info.json").write_text("{}")
    for name in names:
        (directory / name).write_bytes(b"\xff\xff\xff\xff placeholder")
    return directory
