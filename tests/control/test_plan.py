"""`dflash-train plan`: the best targets:drafters split from the stage rates of a run's
stream (a synthetic one, written with the real StatusWriter) or from given rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_train.pipeline import split_plan
from dflash_train.stream.writer import StatusWriter

TOKENS = 8192


def _plan(*argv: str) -> tuple[int, dict | str]:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_train", "plan", *argv],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    out = done.stdout.strip()
    return done.returncode, (json.loads(out) if out.startswith("{") else out)


def write_run(run_dir: Path, target_ms: float, drafter_ms: float, shared: bool = False) -> None:
    """A run_start, steps of TOKENS tokens each, and profile lines: the first (compile and
    warm-up) far slower than the rest, which the planner leaves out."""
    run_dir.mkdir(parents=True)
    writer = StatusWriter(run_dir / "status.jsonl", "run1")
    devices = (["cuda:0"], ["cuda:0"]) if shared else (["cuda:0", "cuda:1"], ["cuda:2"])
    writer.write(
        "run_start", config={"target_model": "random:qwen3.5-27b", "tokens_per_batch": 4096},
        topology={"target": devices[0], "drafter": devices[1], "world_size": 1},
        dataset={}, batches_per_epoch=100, total_steps=100, pid=1, host="box",
    )  # fmt: skip
    stages = {"load": 20.0, "copy": 0.2, "optimizer": 0.1 * drafter_ms}
    writer.write(
        "profile", stages_ms=stages | {"target_fwd": 30_000.0, "drafter_fwd_bwd": 9e4}, allocator={}
    )
    for step in range(1, 21):
        writer.write(
            "step", step=step, epoch=0, epoch_progress=step / 100, loss=1.0, acc=0.5,
            tau=2.0, lr=1e-4, grad_norm=1.0, tokens=step * TOKENS, ktok_s=5.0,
        )  # fmt: skip
        if step % 5 == 0:
            writer.write(
                "profile",
                stages_ms=stages | {"target_fwd": target_ms, "drafter_fwd_bwd": 0.9 * drafter_ms},
                allocator={},
            )  # fmt: skip
    writer.close()


def test_the_split_follows_the_two_rates() -> None:
    rates = split_plan.StageRates(9.2, 4.56, "given")
    best = split_plan.best_split(rates, 8)
    assert (best.targets, best.drafters) == (3, 5)
    assert best.ktok_s == pytest.approx(22.8) and best.drafter_util == 1.0
    assert best.target_util == pytest.approx(22.8 / 27.6, abs=1e-3)
    assert [s.ratio for s in split_plan.all_splits(rates, 3)] == ["1:2", "2:1"]
    # Equal rates: the even split, both stages busy.
    even = split_plan.best_split(split_plan.StageRates(10.0, 10.0, "given"), 8)
    assert (even.targets, even.ktok_s, even.target_util, even.drafter_util) == (4, 40.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="need 2"):
        split_plan.all_splits(rates, 1)


def test_plan_reads_the_rates_from_a_runs_stream(tmp_path: Path) -> None:
    # 8192 tokens: 800 ms of target forward = 10.24 Ktok/s a replica; 1600 ms of drafter
    # (fwd+bwd + optimiser) = 5.12 Ktok/s a rank: two drafters per target.
    write_run(tmp_path / "run", target_ms=800.0, drafter_ms=1600.0)
    code, reply = _plan("--gpus", "6", "--from", str(tmp_path / "run"))
    assert code == 0 and isinstance(reply, dict) and reply["ok"], reply
    assert reply["rates"]["target_ktok_s"] == pytest.approx(10.24)
    assert reply["rates"]["drafter_ktok_s"] == pytest.approx(5.12)
    assert reply["rates"]["notes"] == []
    assert "4 profile lines" in reply["rates"]["source"]
    assert reply["best"] == {
        "targets": 2, "drafters": 4, "ktok_s": 20.48, "target_util": 1.0, "drafter_util": 1.0,
    }  # fmt: skip
    assert reply["current"]["targets"] == 2 and reply["current"]["drafters"] == 1
    assert reply["current"]["ktok_s"] == pytest.approx(5.12)
    assert len(reply["splits"]) == 5
    code, text = _plan("--gpus", "6", "--from", str(tmp_path / "run"), "--table")
    assert code == 0 and isinstance(text, str)
    assert "  2:4      20.48         100%          100%  <- best" in text.splitlines()


def test_plan_says_when_the_rates_came_from_a_shared_gpu(tmp_path: Path) -> None:
    write_run(tmp_path / "run", target_ms=500.0, drafter_ms=500.0, shared=True)
    code, reply = _plan("--gpus", "8", "--from", str(tmp_path / "run"), "--target-model", "x")
    assert code == 0 and isinstance(reply, dict)
    notes = reply["rates"]["notes"]
    assert "shared cuda:0" in notes[0] and "lower bounds" in notes[0]
    assert notes[1] == "the run trained random:qwen3.5-27b, not x"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--gpus", "1", "--target-ktok-s", "1", "--drafter-ktok-s", "1"], "gpus: 1 leaves no GPU"),
        (["--gpus", "8"], "rates: give --from RUN_DIR or both"),
        (["--gpus", "8", "--target-ktok-s", "3"], "rates: give --from RUN_DIR or both"),
        (["--gpus", "8", "--target-ktok-s", "0", "--drafter-ktok-s", "2"], "target_ktok_s: 0 must"),
        (["--gpus", "8", "--from", "/nonexistent/run"], "does not exist"),
    ],
)
def test_bad_plan_arguments_are_refused_in_one_line(argv: list[str], error: str) -> None:
    code, reply = _plan(*argv)
    assert code == 2 and isinstance(reply, dict) and not reply["ok"]
    assert error in reply["error"] and "\n" not in reply["error"]


def test_a_stream_without_profiles_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = StatusWriter(run_dir / "status.jsonl", "run1")
    writer.write(
        "run_start", config={}, topology={"target": ["cpu"], "drafter": ["cpu"]}, dataset={},
        batches_per_epoch=1, total_steps=1, pid=1, host="box",
    )  # fmt: skip
    writer.close()
    code, reply = _plan("--gpus", "8", "--from", str(run_dir))
    assert code == 2 and isinstance(reply, dict)
    assert reply["error"].startswith("from: no profile line with both target_fwd")
