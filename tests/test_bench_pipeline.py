"""bench/pipeline.py runs where CI runs (`--device cpu --smoke`), so the GPU benchmark does
not rot between device sessions: every section produces a rate and the summary is whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTIONS = (
    "target_forward_only",
    "drafter_step_only",
    "sync_pipeline",
    "async_pipeline",
    "async_pipeline_monitored",
)
# Half a second per timed section (the smoke default is 3 s): the assertions need a rate
# and one iteration, not a stable figure, and each run times four or five sections.
SECTION_SECONDS = "0.5"


def _bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run the bench as a user would (`--device cpu --smoke`) and read its JSON result."""
    out = tmp_path / "bench.json"
    argv = [sys.executable, "bench/pipeline.py", "--device", "cpu", "--smoke",
            "--seconds", SECTION_SECONDS, *args, "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("target", "architecture"),
    [("random:qwen3-8b", "qwen3"), ("random:qwen3.5-27b", "qwen3_5_text")],
    ids=["dense", "hybrid"],
)
def test_pipeline_bench_smoke_on_cpu(tmp_path: Path, target: str, architecture: str) -> None:
    result = _bench(tmp_path, "--target", target)
    assert result["architecture"] == architecture
    for section in SECTIONS:
        assert "error" not in result[section], (section, result[section])
        assert result[section]["ktok_s"] > 0 and result[section]["iters"] >= 1
    summary = result["summary"]
    # The summary rounds its figures to 3 decimals (a relative 1e-3 failed at 0.15 Ktok/s).
    assert summary["async_ktok_s"] == round(result["async_pipeline"]["ktok_s"], 3)
    split = summary["balanced_split_8_gpus"]
    assert split["target_gpus"] + split["drafter_gpus"] == 8
    assert summary["pipeline_efficiency"] > 0
    assert 0 <= summary["drafter_starved"] <= 1
    assert "monitor_overhead" in summary


def test_monitor_overhead_rounds_alternate_off_and_on(tmp_path: Path) -> None:
    result = _bench(tmp_path, "--overhead-only", "--overhead-rounds", "2")
    assert "target_forward_only" not in result and "sync_pipeline" not in result
    for name in ("async_pipeline", "async_pipeline_monitored",
                 "async_pipeline_2", "async_pipeline_monitored_2"):  # fmt: skip
        assert result[name]["ktok_s"] > 0, (name, result[name])
    rounds = result["summary"]["monitor_overhead_rounds"]
    assert len(rounds) == 2
    assert rounds[0] == pytest.approx(result["summary"]["monitor_overhead"], abs=1e-3)
