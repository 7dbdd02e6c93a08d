"""Runs the real `dflash-train train` as a subprocess for the lifecycle tests, with a tiny
drafter and small batches, and reads back what it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dflash_train import protocol
from dflash_train.config.recipes import CPU_TINY

# Small everything: one drafter layer fed by one target layer, short blocks, small batches.
TINY = (*CPU_TINY.argv(), "--lr", "3e-3")


def trainer_with_warm_up(compile_body: str) -> str:
    """A `python -c` program: `dflash-train train` (its arguments after the first, which
    the program may read) whose compile warm-up is `compile_body`, the source of a
    `compile(**kwargs)` that may call `real_compile(**kwargs)`; the warm-up's beat every
    0.2 s instead of 5 s."""
    return f"""
import subprocess, sys, time
from pathlib import Path
from dflash_train.cli import main
from dflash_train.training import run as run_module

real_compile = run_module.compile_before_workers
{compile_body}
run_module.compile_before_workers = compile
run_module.WARM_UP_BEAT_S = 0.2
sys.exit(main(sys.argv[2:]))
"""


def train_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    # Two shared cores: one thread each keeps runs quick and float results deterministic.
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return env | extra


def train_argv(target: str, data_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "dflash_train", "train",
        "--target-model", target,
        "--data-dir", str(data_dir),
        "--output-dir", str(run_dir),
        *TINY,
        *extra,
    ]  # fmt: skip


def run_train(
    argv: Sequence[str], *, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), env=train_env(**env), capture_output=True, text=True, timeout=timeout
    )


def start_train(argv: Sequence[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            list(argv), env=train_env(**env), stdout=fh, stderr=subprocess.STDOUT
        )


def status_lines(run_dir: Path) -> list[protocol.StatusLine]:
    path = run_dir / "status.jsonl"
    if not path.exists():
        return []
    lines = []
    for raw in path.read_bytes().splitlines():
        decoded = protocol.decode_line(raw)
        assert isinstance(decoded, protocol.StatusLine), decoded
        lines.append(decoded)
    return lines


def wait_for(
    run_dir: Path,
    predicate: Callable[[protocol.StatusLine], bool],
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 120,
) -> protocol.StatusLine:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in status_lines(run_dir):
            if predicate(line):
                return line
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    for line in status_lines(run_dir):
        if predicate(line):
            return line
    raise AssertionError(f"line never came (rc={proc.poll()}):\n{log.read_text()[-3000:]}")


def losses_by_step(lines: Sequence[protocol.StatusLine]) -> dict[int, float]:
    return {line["step"]: line["loss"] for line in lines if line.kind == "step"}


def lrs_by_step(lines: Sequence[protocol.StatusLine]) -> dict[int, float]:
    return {line["step"]: line["lr"] for line in lines if line.kind == "step"}
