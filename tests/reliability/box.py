"""The box side of the reliability tests: the real `dflash-train` control commands run as
subprocesses (as the console's SSH commands run them), tiny train arguments for the real
SmolLM2 target, and readers for what a run directory holds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.config.recipes import CPU_TINY
from dflash_train.rundir import lock_is_held

TRAINER = (sys.executable, "-m", "dflash_train")
# One drafter layer on one target layer, 4-token blocks, ~6 batches an epoch: about one
# step a second on two shared cores.
TINY_TRAIN = tuple(CPU_TINY.argv())


def tiny_train_args(target: str, data_dir: Path, *extra: str) -> list[str]:
    return ["--target-model", target, "--data-dir", str(data_dir), *TINY_TRAIN, *extra]


def trainer_env() -> dict[str, str]:
    """What a launch must pass explicitly: the box gives the trainer only PATH, HOME, LANG."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if "DFLASH_CACHE_DIR" in os.environ:
        env["DFLASH_CACHE_DIR"] = os.environ["DFLASH_CACHE_DIR"]
    return env


def env_options(env: dict[str, str]) -> list[str]:
    return [word for name, value in env.items() for word in ("--env", f"{name}={value}")]


def control(*argv: str, timeout: float = 240) -> protocol.Reply:
    """Run one control command and decode its JSON reply (failing the test on no reply)."""
    done = subprocess.run(
        [*TRAINER, *argv], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    reply = protocol.decode_reply(done.stdout)
    assert isinstance(reply, protocol.Reply), (argv, done.stdout[-2000:], done.stderr[-2000:])
    return reply


def launch(run_dir: Path, train_args: Sequence[str], *, wait: float = 200) -> protocol.Reply:
    options = ["--wait", f"{wait:g}", *env_options(trainer_env())]
    return control("launch", str(run_dir), *options, "--", *train_args, timeout=wait + 60)


def status(run_dir: Path, stall_after: float = 120) -> protocol.Reply:
    return control("status", str(run_dir), "--stall-after", f"{stall_after:g}")


def lines(run_dir: Path, name: str = "status.jsonl") -> list[protocol.StatusLine]:
    """Every line of a stream, each of which must decode: a corrupt stream fails here."""
    path = run_dir / name
    if not path.exists():
        return []
    out = []
    for raw in path.read_bytes().splitlines():
        decoded = protocol.decode_line(raw)
        assert isinstance(decoded, protocol.StatusLine), (raw[:300], decoded)
        out.append(decoded)
    return out


def wait_line(
    run_dir: Path,
    predicate: Callable[[protocol.StatusLine], bool],
    *,
    timeout: float = 120,
    what: str = "a line",
) -> protocol.StatusLine:
    deadline = time.monotonic() + timeout
    while True:
        for line in reversed(lines(run_dir)):
            if predicate(line):
                return line
        if time.monotonic() > deadline:
            log = (run_dir / "train.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"timed out waiting for {what}; train.log tail:\n{log}")
        time.sleep(0.1)


def run_record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def signal_group(run_dir: Path, sig: signal.Signals) -> int:
    """Send `sig` to the trainer's recorded process group (as `stop` does)."""
    pgid = run_record(run_dir)["pgid"]
    os.killpg(pgid, sig)
    return pgid


def wait_unlocked(run_dir: Path, timeout: float = 15) -> None:
    """A signalled process needs a moment to die; its flock goes with it."""
    deadline = time.monotonic() + timeout
    while lock_is_held(run_dir / "run.lock"):
        assert time.monotonic() < deadline, "the trainer still holds run.lock"
        time.sleep(0.05)


def sigkill(run_dir: Path) -> None:
    signal_group(run_dir, signal.SIGKILL)
    wait_unlocked(run_dir)


def kill_run(run_dir: Path) -> None:
    """Test cleanup: SIGKILL the recorded group (continued first, in case it was stopped)."""
    with contextlib.suppress(FileNotFoundError, KeyError, ValueError, ProcessLookupError):
        signal_group(run_dir, signal.SIGCONT)
        signal_group(run_dir, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while lock_is_held(run_dir / "run.lock") and time.monotonic() < deadline:
        time.sleep(0.05)
