"""`dflash-train report`: one self-contained HTML file from a run's stream alone, opened in
headless Chromium (Playwright drives Debian's /usr/bin/chromium) with every plot drawn and
nothing fetched; `--png`; the regex fast path reads what a line-by-line decode reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dflash_train import protocol
from dflash_train.report import plots
from dflash_train.report.series import read_run
from tests.browser import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[1]
# A real 300-step run on an H200: steps every 5, gpu lines, 4 checkpoints, run_end.
REAL = ROOT / "bench/results/launch_h200_2026-12-01/train_h200_launch5_300steps.status.jsonl"


def _append(stream: Path, kind: str, **fields: object) -> None:
    lines = stream.read_text(encoding="utf-8").splitlines()
    last = json.loads(lines[-1])
    text = protocol.encode_line(
        kind, seq=last["seq"] + 1, run=last["run"], t=last["t"] + 1, **fields
    )
    with stream.open("a", encoding="utf-8") as fh:
        fh.write(text)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real run, then what a long run adds: a restart, two held-out evaluations, an
    alert, and a line that does not decode."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    run_dir.mkdir()
    stream = run_dir / "status.jsonl"
    stream.write_bytes(REAL.read_bytes())
    start = json.loads(REAL.read_text(encoding="utf-8").splitlines()[0])
    fields = {k: v for k, v in start.items() if k not in protocol.ENVELOPE}
    _append(stream, "run_start", **(fields | {"start_step": 300}))
    for step, tau in ((100, 1.4), (300, 1.9)):
        figures = {"tau": tau, "tau_tf": tau + 0.1, "lossless": True, "seconds": 9.0}
        _append(stream, "event", level="info", code="eval", message="held-out", step=step,
                prompts=16, tokens=128, **figures)  # fmt: skip
    _append(stream, "event", level="error", code="nonfinite_step", message="2 steps", step=250)
    with stream.open("a", encoding="utf-8") as fh:
        fh.write('{"v": 1, "broken\n')
    return run_dir


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_train.cli", "report", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_the_report_opens_in_chromium_with_every_plot_and_fetches_nothing(
    run_dir: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    done = _report(str(run_dir), "--out", str(out), "--png")
    assert done.returncode == 0, done.stderr
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("request", lambda request: requests.append(request.url))
        page.goto(out.as_uri())
        page.wait_for_load_state("load")
        drawn = page.eval_on_selector_all(
            "figure img",
            "imgs => imgs.map(i => [i.closest('figure').id, i.complete, i.naturalWidth])",
        )
        marks = page.inner_text("#marks")
        checkpoint_rows = page.eval_on_selector_all("#checkpoints tr", "rows => rows.length")
        heldout = page.eval_on_selector_all(
            "#checkpoints tr td:nth-child(4)", "cells => cells.map(c => c.innerText)"
        )
        config = page.inner_text("#config")
        alerts = page.inner_text("#alerts")
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        browser.close()
    assert [d[0] for d in drawn] == [f"plot-{name}" for name in plots.PLOTS]
    assert all(complete and width == 1000 for _, complete, width in drawn), drawn
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert marks == (
        "Marked on every plot: 4 checkpoints (grey dotted), 1 restarts (blue dashed), "
        "1 alerts (red)."
    )
    assert checkpoint_rows == 1 + 4
    assert heldout[:2] == ["1.400", "—"] and heldout[-1] == "1.900"  # steps 100 ... 300
    assert "target_model" in config and "smollm2" not in alerts
    assert "nonfinite_step: 2 steps" in alerts
    total = len((run_dir / "status.jsonl").read_text(encoding="utf-8").splitlines())
    assert f"1 of {total} did not decode" in out.read_text(encoding="utf-8")


def test_every_plot_has_its_data(run_dir: Path) -> None:
    series = read_run(run_dir / "status.jsonl")
    assert all(plots.has_data(name, series) for name in plots.PLOTS)
    assert len(series.steps) == 61 and series.steps[-1] == 300
    assert [m.step for m in series.restarts] == [300.0]
    assert [e["tau"] for e in series.evals] == [1.4, 1.9]
    assert series.gpu_roles == {0: "target+drafter"} and len(series.gpu_t) > 10
    assert series.rejected == 1 and series.end == {
        "reason": "completed",
        "exit_code": 0,
        "step": 300,
    }


def test_the_fast_path_reads_what_a_line_by_line_decode_reads(
    run_dir: Path, tmp_path: Path
) -> None:
    """Another encoder's spelling (spaces after separators) misses the regexes: every line
    is then decoded on its own, and the figures must come out the same."""
    spaced = tmp_path / "status.jsonl"
    lines = (run_dir / "status.jsonl").read_text(encoding="utf-8").splitlines()
    spaced.write_text(
        "\n".join(json.dumps(json.loads(line)) if line.endswith("}") else line for line in lines)
        + "\n"
    )
    fast, slow = read_run(run_dir / "status.jsonl"), read_run(spaced)
    assert fast.lines == slow.lines and fast.rejected == slow.rejected == 1
    np.testing.assert_array_equal(fast.steps, slow.steps)
    np.testing.assert_array_equal(fast.step_t, slow.step_t)
    for name in fast.metrics:
        np.testing.assert_array_equal(fast.metrics[name], slow.metrics[name])
    np.testing.assert_array_equal(fast.gpu_t, slow.gpu_t)
    assert fast.gpu_util.keys() == slow.gpu_util.keys()
    for index in fast.gpu_util:
        np.testing.assert_array_equal(fast.gpu_util[index], slow.gpu_util[index])
    assert (fast.checkpoints, fast.evals, fast.restarts, fast.alerts) == (
        slow.checkpoints,
        slow.evals,
        slow.restarts,
        slow.alerts,
    )


def test_smoothing_skips_non_finite_steps_and_buckets_keep_the_mean() -> None:
    values = np.array([1.0, np.nan, 3.0, 5.0])
    np.testing.assert_allclose(plots.smoothed(values, 2), [1.0, 1.0, 3.0, 4.0])
    x, y = plots.bucketed(np.arange(10.0), np.arange(10.0), points=2)
    np.testing.assert_allclose(x, [2.0, 7.0])
    np.testing.assert_allclose(y, [2.0, 7.0])


def test_bad_input_is_one_line_naming_the_argument(tmp_path: Path) -> None:
    missing = _report(str(tmp_path / "nope"), "--out", str(tmp_path / "r.html"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"dflash-train report: run_dir: {tmp_path / 'nope' / 'status.jsonl'} is not a status stream"
    )
    (tmp_path / "status.jsonl").write_text("")
    nowhere = _report(str(tmp_path), "--out", str(tmp_path / "no" / "r.html"))
    assert (
        nowhere.stderr.strip() == f"dflash-train report: out: {tmp_path / 'no'} is not a directory"
    )
    empty = _report(str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert empty.returncode == 2 and "holds no run_start and no step" in empty.stderr
