"""Bench (not a test): how soon a CPU user sees training steps, with the README's CPU recipe
and with the defaults (the GPU recipe). Runs the real `dflash-train train` on SmolLM2 against
a prepared dataset for a fixed wall time each, then reads the stream: seconds from the
process start to `run_start`, to the first `step`, and steps done.

    .venv/bin/python bench/cpu_recipe.py --data-dir DATA [--seconds 100] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.config.recipes import CPU_README

# README.md's trainer example on a CPU (the cpu_readme recipe), but its target and devices:
# both runs below give those.
CPU_RECIPE = CPU_README.argv(leave_out=("target_model", "target_gpus", "drafter_gpus"))


def measure(data_dir: str, recipe: list[str], seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cpu-recipe-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = [
            sys.executable, "-m", "dflash_train", "train", "--target-model", "smollm2",
            "--data-dir", data_dir, "--output-dir", str(run_dir),
            "--target-gpus", "cpu", "--drafter-gpus", "cpu", *recipe,
        ]  # fmt: skip
        start = time.time()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=600)
        lines = [
            line
            for raw in (run_dir / "status.jsonl").read_bytes().splitlines()
            if isinstance(line := protocol.decode_line(raw), protocol.StatusLine)
        ]
    starts = [line for line in lines if line.kind == "run_start"]
    steps = [line for line in lines if line.kind == "step"]
    return {
        "recipe": recipe or "defaults",
        "wall_s": seconds,
        "run_start_s": round(starts[0].t - start, 1) if starts else None,
        "first_step_s": round(steps[0].t - start, 1) if steps else None,
        "steps": steps[-1]["step"] if steps else 0,
        "total_steps": starts[0]["total_steps"] if starts else None,
        "loss_first_last": [steps[0]["loss"], steps[-1]["loss"]] if steps else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {
        "cpu_count": os.cpu_count(),
        "runs": [
            measure(args.data_dir, CPU_RECIPE, args.seconds),
            measure(args.data_dir, [], args.seconds),
        ],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
