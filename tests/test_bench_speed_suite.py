"""bench/pipeline.py --suite speed runs where CI runs (--device cpu, toy size), so the H200
speed suite does not rot between device sessions: the drafter case and the checkpoint-stall
case (a real async save that loads back) produce their figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_speed_suite_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    argv = [
        sys.executable, "bench/pipeline.py", "--suite", "speed", "--device", "cpu",
        "--steps", "1", "--cases", "drafter_tiny_1x128,checkpoint_stall", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(out.read_text())["cases"]
    drafter = cases["drafter_tiny_1x128"]
    assert drafter["sdpa"]["ktok_s"] > 0 and drafter["sdpa"]["ms_per_step"] > 0
    assert drafter["fused_ce_vs_reference"]["grad_rel_err"] < 1e-5
    stall = cases["checkpoint_stall"]
    assert stall["newest_loadable_step"] == 3 and len(stall["background_write_s"]) == 2
    assert set(cases) == {"drafter_tiny_1x128", "checkpoint_stall"}
