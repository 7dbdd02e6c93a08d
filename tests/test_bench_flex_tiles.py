"""bench/flex_tiles.py runs where CI runs (`--device cpu --smoke`: eager flex on the trainer's
block mask, two configs), so the GPU comparison of flex's tile configurations does not rot
between device sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'bench'}", "OMP_NUM_THREADS": "1"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "bench/flex_tiles.py", "--device", "cpu", *args]
    return subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)


def test_flex_tiles_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "tiles.json"
    done = _run("--smoke", "--repeats", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dims"] == "tiny" and result["compiled"] is False
    # The trainer's padded lengths: 8 anchors x block 4 -> 256 queries; 128 + 256 keys.
    assert result["shape"]["padded_queries"] == 256 and result["shape"]["keys"] == 512
    configs = result["configs"]
    assert list(configs) == ["default", "bwd_warps8"]
    for got in configs.values():
        # Times only: which is larger is the GPU's figure, not a CPU smoke's (2 repeats of
        # eager flex on a quiet 2-core box once timed fwd+bwd 73.5 ms under fwd's 74.6).
        assert got["fwd_ms"] > 0 and got["fwd_bwd_ms"] > 0
        assert got["bwd_ms"] == round(got["fwd_bwd_ms"] - got["fwd_ms"], 3)
        # Eager flex ignores kernel options: the same math gives the same numbers.
        assert set(got["max_diff_vs_default"]) == {"out", "grad_q", "grad_k", "grad_v"}
        assert all(diff == 0.0 for diff in got["max_diff_vs_default"].values())
    assert "bwd ms" in done.stdout and "bwd_warps8" in done.stdout


def test_flex_tiles_refuses_unknown_configs_in_one_line(tmp_path: Path) -> None:
    done = _run("--configs", "default,huge_tiles", "--out", str(tmp_path / "x.json"))
    assert done.returncode == 2
    assert "--configs: ['huge_tiles']: names from" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x.json").exists()
