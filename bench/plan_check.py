"""Issue 28 goal 4's check: does `dflash-train plan` predict a measured async pipeline within
10 %? Two real runs of one recipe on one device:

1. `dflash-train plan --gpus 8 --measure`: the calibration run (sync pipeline, the stages
   taking turns on the device) gives the two stage rates;
2. `dflash-train train` in the async pipeline with the target replicas and the drafter sharing
   that device (`--replicas`, default 2), stopped after `--pipeline-seconds`; its rate is its
   step lines' tokens over their time after the first third of its steps (compile, warm-up).

The prediction is `split_plan.topology_split` of the calibration's rates for that placement
(one device shared: t·d / (t + d), the replicas splitting the target's share of it).

    python bench/plan_check.py --target-model random:qwen3-8b --data-dir /tmp/synth \\
        --device 0 --out plan_check_h200.json -- --draft-layers 2 --tokens-per-batch 8192
    python bench/plan_check.py --target-model smollm2 --data-dir DATA --device cpu \\
        --measure-seconds 6 --pipeline-seconds 30 --out r.json -- --draft-layers 1 \\
        --block-size 4 --num-anchors 8 --tokens-per-batch 512 --max-length 128   # CPU smoke
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

from dflash_train.pipeline import split_plan

DFLASH = [sys.executable, "-m", "dflash_train"]


def log(message: str) -> None:
    print(f"[plan_check] {message}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-model", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--device", default="0", help="the one device: a GPU index or cpu")
    p.add_argument("--replicas", type=int, default=2, help="target replicas on the device")
    p.add_argument("--measure-seconds", type=float, default=60.0)
    p.add_argument("--pipeline-seconds", type=float, default=150.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/plan_check"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("recipe", nargs=argparse.REMAINDER, help="-- more train arguments")
    args = p.parse_args()
    args.recipe = [w for w in args.recipe if w != "--"]
    return args


def calibrate(args: argparse.Namespace, recipe: list[str]) -> dict[str, Any]:
    cal = args.work / "calibration"
    argv = [
        *DFLASH, "plan", "--gpus", "8", "--measure", "--measure-seconds",
        f"{args.measure_seconds:g}", "--measure-dir", str(cal), "--", *recipe,
        "--target-gpus", args.device, "--drafter-gpus", args.device,
    ]  # fmt: skip
    log("calibration: " + " ".join(argv[2:]))
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    sys.stderr.write(done.stderr[-2000:])
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    if not reply.get("ok"):
        raise SystemExit(f"calibration failed: {reply.get('error')}")
    reply["wall_s"] = round(time.monotonic() - start, 1)
    return reply


def _has_step(status: Path) -> bool:
    return status.is_file() and any(x.kind == "step" for x in split_plan.read_stream(status))


def pipeline_run(args: argparse.Namespace, recipe: list[str]) -> tuple[float, dict[str, Any]]:
    """The async pipeline on the shared device for pipeline_seconds after its first step; its
    steady rate in Ktok/s and what it ran."""
    run_dir = args.work / "pipeline"
    argv = [
        *DFLASH, "train", *recipe, "--output-dir", str(run_dir), "--pipeline", "async",
        "--target-gpus", ",".join([args.device] * args.replicas), "--drafter-gpus", args.device,
        "--eval-every", "0", "--save-every", "0",
    ]  # fmt: skip
    log("pipeline: " + " ".join(argv[2:]))
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "train.log").open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=os.environ | {"WANDB_MODE": "disabled"},
        )  # fmt: skip
    status = run_dir / "status.jsonl"
    first_step_at: float | None = None
    started = time.monotonic()
    while proc.poll() is None:
        if first_step_at is None and _has_step(status):
            first_step_at = time.monotonic()
            log(f"pipeline: first step after {first_step_at - started:.0f} s")
        if first_step_at is not None and time.monotonic() - first_step_at > args.pipeline_seconds:
            break
        time.sleep(1.0)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=300)
    lines = split_plan.read_stream(status)
    steps = [line for line in lines if line.kind == "step"]
    if len(steps) < 6:
        raise SystemExit(f"pipeline: only {len(steps)} steps; train.log in {run_dir}")
    steady = steps[len(steps) // 3 :]
    tokens = steady[-1]["tokens"] - steady[0]["tokens"]
    seconds = steady[-1].t - steady[0].t
    start = next(line for line in lines if line.kind == "run_start")
    return tokens / seconds / 1000.0, {
        "topology": start["topology"],
        "steps": len(steps),
        "steady_steps": len(steady) - 1,
        "steady_seconds": round(seconds, 2),
        "steady_tokens": tokens,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    args = parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    # A new dir each time: a rerun on a warm machine finds the last one's runs there.
    args.work = Path(tempfile.mkdtemp(prefix="check.", dir=args.work))
    recipe = ["--target-model", args.target_model, "--data-dir", args.data_dir, *args.recipe]
    cal = calibrate(args, recipe)
    rates = split_plan.StageRates(
        cal["rates"]["target_ktok_s"], cal["rates"]["drafter_ktok_s"], cal["rates"]["source"]
    )
    device = "cpu" if args.device == "cpu" else f"cuda:{args.device}"
    predicted = split_plan.topology_split(rates, [device] * args.replicas, [device])
    log(f"rates: target {rates.target_ktok_s} drafter {rates.drafter_ktok_s}; predicted "
        f"{predicted.ktok_s} Ktok/s")  # fmt: skip
    measured, run = pipeline_run(args, recipe)
    error = measured / predicted.ktok_s - 1.0
    result = {
        "what": "dflash-train plan's prediction for one device shared by the target replicas "
        "and the drafter, against that async pipeline measured (issue 28 goal 4: within 10 %)",
        "recipe": recipe,
        "calibration": {k: cal[k] for k in ("rates", "measured", "wall_s")},
        "placement": {"target": [device] * args.replicas, "drafter": [device]},
        "predicted_ktok_s": predicted.ktok_s,
        "measured_ktok_s": round(measured, 3),
        "error": round(error, 4),
        "within_10_percent": abs(error) <= 0.10,
        "pipeline": run,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"predicted {predicted.ktok_s:.3f} Ktok/s, measured {measured:.3f}: {error:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
