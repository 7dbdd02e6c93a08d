"""bench/quality/lineage.py's fits: the whole line through every hop, and with --recent K
the last K hops' own line, which is how a bend in the curve shows (session 40's run 13 sat
0.028 under the whole line and within 0.004 of the last three hops')."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _hop(root: Path, name: str, steps: int, tau: float) -> str:
    where = root / name
    where.mkdir()
    curve = [{"step": steps // 2, "tau": tau - 0.1}, {"step": steps, "tau": tau - 0.05}]
    record = {"steps": steps, "tau": tau, "lossless": True, "heldout_tau_curve": curve}
    (where / "result.json").write_text(json.dumps(record))
    return f"{name}={where}"


def _lineage(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "bench/quality/lineage.py", *args, "--out", str(tmp_path / "out")]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def _bent(tmp_path: Path) -> tuple[list[str], list[float]]:
    """Four hops whose 40 x 256 tau lies on 1 + 0.2 ln S up to the second hop's end and on
    2 + 0.1 ln S from there: the last three hops are on the flatter line exactly."""
    ends = [1000.0, math.exp(10.0), math.exp(10.5), math.exp(11.0)]
    taus = [1 + 0.2 * math.log(ends[0]), 3.0, 3.05, 3.1]
    named, done = [], 0
    for i, (end, tau) in enumerate(zip(ends, taus, strict=True)):
        steps = round(end) - done
        named.append(_hop(tmp_path, f"run{i}", steps, tau))
        done += steps
    return named, taus


def test_recent_fits_the_last_hops_alone_and_finds_the_bend(tmp_path: Path) -> None:
    named, _ = _bent(tmp_path)
    done = _lineage(tmp_path, *named, "--goal", "3.2", "--recent", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    fit: dict[str, Any] = json.loads((tmp_path / "out" / "fit.json").read_text())
    recent = fit["recent"]
    assert recent["hops"] == ["run1", "run2", "run3"]
    # the hops' ends are rounded to whole steps, so the line is exact to ~1e-4
    assert math.isclose(recent["slope"], 0.1, abs_tol=2e-4)
    assert math.isclose(recent["intercept"], 2.0, abs_tol=3e-3)
    assert recent["max_abs_residual"] <= 2e-4
    # 3.2 on the flatter line is at ln S = 12, where the whole line, pulled up by the
    # first hop's steeper start, puts it sooner
    assert math.isclose(recent["steps_for_goal"], math.exp(12.0), rel_tol=5e-3)
    assert recent["more_steps"] == recent["steps_for_goal"] - round(math.exp(11.0))
    assert fit["slope"] > recent["slope"] and fit["steps_for_goal"] < recent["steps_for_goal"]
    assert (tmp_path / "out" / "lineage.png").stat().st_size > 0


def test_without_recent_the_fit_has_none_and_one_hop_is_refused(tmp_path: Path) -> None:
    named, _ = _bent(tmp_path)
    done = _lineage(tmp_path, *named, "--goal", "3.2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "recent" not in json.loads((tmp_path / "out" / "fit.json").read_text())
    refused = _lineage(tmp_path, *named, "--recent", "1")
    assert refused.returncode == 2
    assert "--recent: a line needs two hops, got 1" in refused.stderr
