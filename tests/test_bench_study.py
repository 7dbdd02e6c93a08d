"""bench/quality/study.py over real runs: two tiny CPU trainings of the real SmolLM2 target with
different recipes, each evaluating held-out tau in the run (`--eval-every`), then the study as
the quality session runs it: every variant's curve at the steps that evaluated, its recipe and
what differs from the baseline in study.json, a table naming the variants, one PNG."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_train.config.recipes import CPU_TINY

REPO = Path(__file__).resolve().parents[1]
STEPS = 4
EVAL = ("--eval-every", "2", "--eval-prompts", "1", "--eval-tokens", "8", "--eval-data", "builtin")
# name -> what its recipe adds to the tests' tiny one (`wide` differs from `base` in three ways)
VARIANTS = {
    "base": (),
    "wide": ("--draft-layers", "2", "--distill", "0.5"),
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    # Two runs share two cores: one thread each, or their OpenMP pools spin against each other.
    return env | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory, prepared_data_dir: Path) -> Path:
    """A study dir as the session's study stage leaves it: one run dir per variant, trained
    side by side to the same step budget, evaluated at steps 2 and 4. `wide` trains on the
    data twice an epoch (`DIR*2`), so its data differs from the baseline's too."""
    root = tmp_path_factory.mktemp("study")
    procs = []
    for name, extra in VARIANTS.items():
        data = f"{prepared_data_dir}*2" if name == "wide" else str(prepared_data_dir)
        argv = [
            sys.executable, "-m", "dflash_train", "train", "--target-model", "smollm2",
            "--data-dir", data, "--output-dir", str(root / name), "--run-id", name,
            *CPU_TINY.argv(), "--pipeline", "sync", "--max-steps", str(STEPS), *EVAL, *extra,
        ]  # fmt: skip
        log = (root / f"{name}.out").open("wb")
        procs.append((name, log, subprocess.Popen(argv, env=_env(), stdout=log, stderr=log)))
    for name, log, proc in procs:
        rc = proc.wait(timeout=300)
        log.close()
        assert rc == 0, (root / f"{name}.out").read_text()[-3000:]
    return root


def _study(out: Path, *runs: str) -> dict[str, Any]:
    argv = [sys.executable, "bench/quality/study.py", *runs, "--out", str(out)]
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "study.json").read_text())


def test_each_variants_curve_recipe_table_and_plot(study_dir: Path, tmp_path: Path) -> None:
    # Named pairs, the baseline given second: the table compares with it, not the first.
    study = _study(
        tmp_path, f"wide={study_dir / 'wide'}", f"base={study_dir / 'base'}", "--baseline", "base"
    )
    assert study["baseline"] == "base"
    variants = {v["name"]: v for v in study["variants"]}
    assert list(variants) == ["wide", "base"]
    for v in variants.values():
        assert [p["step"] for p in v["curve"]] == [2, 4]
        for point in v["curve"]:
            assert point["tau"] >= 1.0 and point["score"] == point["tau"]
            assert (point["prompts"], point["tokens"], point["lossless"]) == (1, 8, True)
            assert point["mismatched"] == 0
        assert v["final_step"] == 4 and v["final_tau"] == v["curve"][-1]["tau"]
        assert v["best_tau"] == max(p["tau"] for p in v["curve"])
        assert (v["steps_done"], v["max_steps"], v["state"]) == (STEPS, STEPS, "completed")
        assert v["config"]["eval_data"] == "builtin" and v["layer_ids"] == [15]
        # The final evaluation's rounds by how many drafts they kept, as shares of them all.
        lengths = v["curve"][-1]["round_lengths"]
        assert sum(lengths) == v["curve"][-1]["blocks"] > 0
        shares = {int(d): share for d, share in v["final_round_shares"].items()}
        assert list(shares) == [d for d in (1, 2, 4, 8) if d < len(lengths)]
        assert shares[1] == sum(lengths[1:]) / sum(lengths)
        # Teacher-forced on samples it trained on; the built-in held-out set has no answers.
        assert v["final_tau_tf_seen"] == v["curve"][-1]["tau_tf_seen"] >= 1.0
        assert v["final_tau_tf"] is None
    samples = variants["base"]["dataset"]["samples"]
    assert variants["wide"]["dataset"]["samples"] == 2 * samples
    assert variants["base"]["differs"] == []
    assert variants["wide"]["differs"] == [
        "distill 0.5", "draft_layers 2", f"data {2 * samples:,} samples (x2.0)"
    ]  # fmt: skip
    table = (tmp_path / "study.md").read_text()
    assert "| base | (baseline) |" in table
    assert "| rounds keeping ≥ 1 / 2 / 4 / 8 drafts, % |" in table
    base = variants["base"]["final_round_shares"]
    shown = " / ".join(f"{100 * share:.0f}" for share in base.values())
    base_row = next(row for row in table.splitlines() if row.startswith("| base |"))
    seen = variants["base"]["final_tau_tf_seen"]
    assert f"| {shown} | {seen:.3f} / – | {STEPS} / {STEPS} |" in base_row
    assert "| wide | distill 0.5; draft_layers 2; data" in table
    assert "1 prompts x up to 8 new tokens of builtin, float32" in table
    png = (tmp_path / "study.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000


def test_a_study_dir_names_its_variants_by_folder_base_first(
    study_dir: Path, tmp_path: Path
) -> None:
    study = _study(tmp_path, str(study_dir))
    assert study["baseline"] == "base"
    assert [v["name"] for v in study["variants"]] == ["base", "wide"]
    assert study["highest_final_tau"] in ("base", "wide")


def test_a_variant_started_again_with_another_budget_shows_the_newest(
    study_dir: Path, tmp_path: Path, prepared_data_dir: Path
) -> None:
    # A variant that stopped (here: `base`, completed at 4 steps) and was started again with
    # a larger --max-steps, resuming its checkpoint, as a session's call for it alone once
    # did: the table's budget and what differs are the newest start's, not the first's. A
    # copy of the study's run, so the module's other tests see `base` as it was.
    run = tmp_path / "again"
    shutil.copytree(study_dir / "base", run)
    argv = [
        sys.executable, "-m", "dflash_train", "train", "--target-model", "smollm2",
        "--data-dir", str(prepared_data_dir), "--output-dir", str(run), "--run-id", "base",
        *CPU_TINY.argv(), "--pipeline", "sync", "--max-steps", "6",
        "--resume-from", "latest", *EVAL,
    ]  # fmt: skip
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    study = _study(tmp_path / "out", f"base={study_dir / 'base'}", f"again={run}")
    again = study["variants"][1]
    assert (again["steps_done"], again["max_steps"], again["state"]) == (6, 6, "completed")
    assert [p["step"] for p in again["curve"]] == [2, 4, 6]
    assert again["differs"] == ["max_steps 6"]
    row = next(r for r in (tmp_path / "out" / "study.md").read_text().splitlines() if "again" in r)
    assert "| 6 / 6 |" in row


def test_write_result_takes_the_runs_own_evaluations_and_the_exports_size(
    study_dir: Path, tmp_path: Path
) -> None:
    # The quality session's train stage with in-run evaluations and no curve.py pass
    # (NO_CURVE): result.json's held-out curve is the stream's `eval` events; the export's
    # bytes and sha256 and the speed-up under the name for the eval's precision.
    work = tmp_path / "work"
    work.mkdir()
    reply = {"command": "eval", "ok": True, "tau": 2.0, "speedup": 1.25, "dtype": "bfloat16"}
    reply["max_new_tokens"] = 32  # the decode length is the eval's, not a fixed 256
    (work / "eval.json").write_text(json.dumps(reply) + "\n")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 40)
    argv = [
        sys.executable, "bench/quality/write_result.py", "--work", str(work),
        "--out", str(tmp_path / "out"), "--status", str(study_dir / "base" / "status.jsonl"),
        "--export-file", str(weights),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    study = _study(tmp_path / "study", f"base={study_dir / 'base'}")
    in_run = [(p["step"], p["tau"]) for p in study["variants"][0]["curve"]]
    assert [(p["step"], p["tau"]) for p in result["heldout_tau_curve"]] == in_run == [
        (2, in_run[0][1]), (4, in_run[1][1])
    ]  # fmt: skip
    assert result["export_bytes"] == 10_240 and result["max_new_tokens"] == 32
    assert result["export_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert result["speedup_bf16"] == 1.25 and "speedup_fp32" not in result
    assert result["steps"] == STEPS
    assert result["trained_on"] is None  # no NVML here: the plot names no GPU
    # The GPU a run trained on is its first `gpu` record's (this line is from a real H100 run
    # of the quality session, 2026-12-06, after whose curve said "on one H200").
    gpu = {
        "v": 1, "seq": 9, "t": 1796563620.0, "run": "x", "kind": "gpu", "available": True,
        "reason": None, "gpus": [{
            "index": 0, "name": "NVIDIA H100 80GB HBM3", "role": "target+drafter", "util": 1.0,
            "mem_used": 1798.8, "mem_total": 81559.0, "power_w": 123.6, "power_limit_w": 700.0,
            "temp_c": 39.0,
        }],
    }  # fmt: skip
    stream = tmp_path / "h100.status.jsonl"
    lines = (study_dir / "base" / "status.jsonl").read_text().splitlines(keepends=True)
    stream.write_text("".join(lines[:3]) + json.dumps(gpu) + "\n" + "".join(lines[3:]))
    argv[argv.index("--status") + 1] = str(stream)
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads((tmp_path / "out" / "result.json").read_text())
    assert again["trained_on"] == "NVIDIA H100 80GB HBM3"
    assert again["heldout_tau_curve"] == result["heldout_tau_curve"]
    # EVAL_BF16: the export decoded in fp32 (tau, losslessness) and again in bf16 (goal 2's
    # speed-up); result.json names each speed-up by its precision and keeps fp32's tau.
    fp32 = {"command": "eval", "ok": True, "tau": 2.5, "speedup": 0.8, "dtype": "float32",
            "lossless": True}  # fmt: skip
    bf16 = {"command": "eval", "ok": True, "tau": 2.6, "speedup": 1.75, "dtype": "bfloat16",
            "lossless": False, "mismatched_prompts": [3], "round_lengths": [1, 2]}  # fmt: skip
    (work / "eval.json").write_text(json.dumps(fp32) + "\n")
    (work / "eval_bf16.json").write_text("progress\n" + json.dumps(bf16) + "\n")
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    both = json.loads((tmp_path / "out" / "result.json").read_text())
    assert (both["tau"], both["lossless"]) == (2.5, True)
    assert (both["speedup_fp32"], both["speedup_bf16"]) == (0.8, 1.75)
    assert both["eval_bf16"]["mismatched_prompts"] == [3]
    assert "round_lengths" not in both["eval_bf16"]


def test_lineage_counts_each_hops_steps_after_the_ones_before(tmp_path: Path) -> None:
    # Two hops of one drafter (the second `--init-from` the first's export): the second's
    # in-run evaluations are placed after the first's steps, each hop's 40 x 256 tau at its
    # end, in lineage.json and a PNG; a hop without a result.json is refused by name.
    first = {
        "steps": 300,
        "tau": 2.4,
        "lossless": True,
        "heldout_tau_curve": [
            {"step": 100, "tau": 1.5},
            {"step": 200, "tau": 2.0},
            {"step": 300, "tau": None},
        ],
    }
    second = {
        "steps": 50, "tau": 2.5, "lossless": True, "init_from": {"run": "r1"},
        "heldout_tau_curve": [{"step": 25, "tau": 2.2}, {"step": 50, "tau": 2.3}],
    }  # fmt: skip
    for name, result in (("a", first), ("b", second)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(result))
    argv = [sys.executable, "bench/quality/lineage.py", f"run1={tmp_path / 'a'}",
            f"run2={tmp_path / 'b'}", "--out", str(tmp_path / "out")]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lineage = json.loads((tmp_path / "out" / "lineage.json").read_text())
    assert [(h["name"], h["start"], h["end"], h["tau_40x256"]) for h in lineage] == [
        ("run1", 0, 300, 2.4), ("run2", 300, 350, 2.5)
    ]  # fmt: skip
    assert [(p["step"], p["hop_step"]) for p in lineage[1]["curve"]] == [(325, 25), (350, 50)]
    assert [p["step"] for p in lineage[0]["curve"]] == [100, 200]  # no tau: not a point
    assert lineage[1]["init_from"] == "r1"
    assert (tmp_path / "out" / "lineage.png").stat().st_size > 0
    # two stars make a line through both; one makes none
    fit = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert fit["residuals"] == {"run1": 0.0, "run2": 0.0} and fit["steps_for_goal"] is None
    done = subprocess.run(argv[:3] + argv[4:], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "fit.json").read_text()) is None
    argv[3] = f"run2={tmp_path / 'missing'}"
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "missing/result.json: unreadable" in done.stderr


def test_lineage_fits_tau_to_the_log_of_total_steps_and_places_the_goal(tmp_path: Path) -> None:
    # Three hops whose 40 x 256 tau lies on 1 + 0.5 ln(steps) but one, 0.03 above: the line,
    # each hop's residual, and where the line reaches --goal (1 + 0.5 ln 6400: 6,400 steps,
    # 4,800 past the last hop's end). A hop without a 40 x 256 figure is not a point.
    ends = {"h1": 100, "h2": 400, "h3": 1600}
    start = 0
    for name, end in ends.items():
        lift = 0.03 if name == "h2" else 0.0
        result = {"steps": end - start, "tau": 1 + 0.5 * math.log(end) + lift}
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(result))
        start = end
    (tmp_path / "h4").mkdir()
    (tmp_path / "h4" / "result.json").write_text(json.dumps({"steps": 0, "tau": None}))
    # ...and two stars at one step make no line (a 0-step hop, measured again)
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "result.json").write_text(json.dumps({"steps": 0, "tau": 1.0}))
    one_end = [sys.executable, "bench/quality/lineage.py", f"h1={tmp_path / 'h1'}",
               f"again={tmp_path / 'again'}", "--out", str(tmp_path / "one_end")]  # fmt: skip
    done = subprocess.run(
        one_end, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "one_end" / "fit.json").read_text()) is None
    goal = 1 + 0.5 * math.log(6400)
    hop_args = [f"{n}={tmp_path / n}" for n in [*ends, "h4"]]
    argv = [sys.executable, "bench/quality/lineage.py", *hop_args, "--out", str(tmp_path / "out"),
            "--goal", str(goal)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    fit = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert set(fit["residuals"]) == {"h1", "h2", "h3"}
    # least squares through (ln 100, 0), (ln 400, 0.03), (ln 1600, 0): the middle point lifts
    # the line by 0.01 and leaves the slope at 0.5
    assert fit["slope"] == pytest.approx(0.5, abs=1e-4)
    assert fit["intercept"] == pytest.approx(1.01, abs=1e-4)
    assert fit["residuals"] == pytest.approx({"h1": -0.01, "h2": 0.02, "h3": -0.01}, abs=1e-4)
    assert fit["max_abs_residual"] == pytest.approx(0.02, abs=1e-4)
    assert fit["per_doubling"] == pytest.approx(0.5 * math.log(2), abs=1e-4)
    # the line sits 0.01 above the exact one, so it reaches the goal a little sooner
    expected = 6400 * math.exp(-0.01 / 0.5)
    assert fit["steps_for_goal"] == pytest.approx(expected, abs=2)
    assert fit["more_steps"] == pytest.approx(expected - 1600, abs=2)
    assert (tmp_path / "out" / "lineage.png").read_bytes().startswith(PNG_MAGIC)
