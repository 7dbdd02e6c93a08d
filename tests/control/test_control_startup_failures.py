"""`launch` against real trainers that fail to start: one crashes (a corrupt shard that
preflight cannot tell from a good one), one hangs (its weights shard is a FIFO nobody
writes, so loading blocks in open(); its launch is hung up on mid-wait, as by a dropped SSH
session). Both must end with the reason, the log tail, no process left behind and a run
directory that says what happened."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from control_harness import SMALL_TRAIN, cli, dflash_argv, trainer_env_args

from dflash_train import protocol
from dflash_train.rundir import lock_is_held, read_json
from dflash_train.targets import frozen_target as targets

# Past the SIGHUP at 2 s; the trainer blocks on the FIFO for good, so any wait hangs.
HANG_WAIT_S = 6


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie waiting for a reaper holds nothing


def test_a_trainer_that_crashes_at_startup(
    run_dirs: Callable[[str], Path], prepared_data_dir: Path, smollm2_spec: str, tmp_path: Path
) -> None:
    data = tmp_path / "corrupt"
    shutil.copytree(prepared_data_dir, data)
    for shard in sorted(data.glob("*.arrow")):
        size = shard.stat().st_size
        shard.write_bytes(b"\x00garbage" * (size // 8 + 1))
    run_dir = run_dirs("crash")
    rc, reply = cli(
        "launch",
        str(run_dir),
        "--wait",
        "240",
        *trainer_env_args(),
        "--",
        "--target-model",
        smollm2_spec,
        "--data-dir",
        str(data),
        *SMALL_TRAIN,
        timeout=300,
    )
    assert rc == 1 and reply.error_code == "exited_at_startup", reply
    assert reply.data["exit_code"] == 1
    log_tail = reply.data["log_tail"]
    assert log_tail[0].startswith("==== dflash-train launch")
    # The trainer's one line names the data dir and its corrupt shard (no traceback).
    assert log_tail[1].startswith(f"dflash-train train: data dir {data}: corrupt shard data-")
    assert _gone(reply.data["pid"]) and not lock_is_held(run_dir / "run.lock")
    assert read_json(run_dir / "run.json")["launch"] == "exited_at_startup"
    _, status = cli("status", str(run_dir))
    # The trainer caught its exception and wrote run_end: an ended run, reason error.
    assert (status.data["state"], status.data["reason"]) == ("finished", "error")
    assert status.data["error_tail"] and status.data["log_tail"]


def _hanging_target(directory: Path, model_dir: Path) -> Path:
    """The real SmolLM2 directory, but its weights come from a sharded index whose one
    shard is a FIFO: config and tokenizer load, then open() of the shard blocks."""
    directory.mkdir()
    for name in os.listdir(model_dir):
        if not name.endswith(".safetensors"):
            shutil.copy(model_dir / name, directory / name)
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    shard = "model-00001-of-00001.safetensors"
    index = {"metadata": {}, "weight_map": {name: shard for name in names}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    os.mkfifo(directory / shard)
    return directory


def test_a_trainer_that_hangs_at_startup_is_ended(
    run_dirs: Callable[[str], Path],
    prepared_data_dir: Path,
    smollm2_target: Path,
    tmp_path: Path,
) -> None:
    target = _hanging_target(tmp_path / "hanging-model", smollm2_target)
    assert targets.resolve_target(str(target)).kind == "hf"  # preflight cannot tell
    run_dir = run_dirs("hang")
    started = time.monotonic()
    launch = subprocess.Popen(
        dflash_argv(
            "launch",
            str(run_dir),
            "--wait",
            str(HANG_WAIT_S),
            *trainer_env_args(),
            "--",
            "--target-model",
            str(target),
            "--data-dir",
            str(prepared_data_dir),
            *SMALL_TRAIN,
        ),
        stdout=subprocess.PIPE,
    )
    # The SSH session that ran it hangs up mid-wait (once launch has started the trainer,
    # however long its own start took): launch must still see it through.
    log = run_dir / "train.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and b"==== dflash-train launch" in log.read_bytes()):
        assert launch.poll() is None and time.monotonic() < deadline, "no trainer started"
        time.sleep(0.05)
    waiting = time.monotonic()
    launch.send_signal(signal.SIGHUP)
    out, _ = launch.communicate(timeout=120)
    rc = launch.returncode
    reply = protocol.decode_reply(out)
    assert isinstance(reply, protocol.Reply), out
    assert rc == 1 and reply.error_code == "startup_timeout", reply
    assert time.monotonic() - started >= HANG_WAIT_S
    assert time.monotonic() - waiting < HANG_WAIT_S + 30
    assert reply.data["log_tail"][0].startswith("==== dflash-train launch")
    # Nothing half-alive: the whole process group is gone and the lock is free.
    pid = reply.data["pid"]
    assert _gone(pid) and not lock_is_held(run_dir / "run.lock")
    record = read_json(run_dir / "run.json")
    assert record["launch"] == "startup_timeout"
    _, status = cli("status", str(run_dir))
    assert status.data["state"] == "crashed" and status.data["launch"] == "startup_timeout"
    assert status.data["log_tail"]
