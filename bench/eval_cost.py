"""Bench (not a test): what the in-run held-out evaluation costs the training run. Two real
`dflash-train train` runs of the same recipe and steps on prepared data (with its
heldout.jsonl), one with `--eval-every 0`, one evaluating every E steps; from their
streams: steady training throughput of each (step lines, after the first --skip steps),
the throughput lost in the evaluating run, each `eval` event's `seconds`, and the loss at
the default interval (an evaluation at every checkpoint, --save-every 500 steps):
eval_s / (500 * step_s + eval_s), with eval_s the steady evaluations' (the first also
decodes greedily, once for the run).

    python bench/eval_cost.py --target-model smollm2 --device cuda:0 --steps 40 \
        --eval-every 20 --out eval_cost.json           # the GPU recipe (the defaults)
    python bench/eval_cost.py --target-model random:tiny --device cpu --steps 6 \
        --eval-every 3 --eval-prompts 2 --eval-tokens 8 --skip 1 -- --draft-layers 1 \
        --block-size 4 --num-anchors 8 --tokens-per-batch 512 --max-length 128  # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflash_train import protocol

DEFAULT_INTERVAL = 500  # train --save-every's default: the in-run evaluation's default interval


def _lines(run_dir: Path) -> list[protocol.StatusLine]:
    raw = (run_dir / "status.jsonl").read_bytes().splitlines()
    return [line for r in raw if isinstance(line := protocol.decode_line(r), protocol.StatusLine)]


def prepare(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    devices = args.device.removeprefix("cuda:")  # prepare's --devices: cpu or a GPU index
    argv = [
        sys.executable, "-m", "dflash_train", "prepare", "--target-model", args.target_model,
        "--prompts", "builtin", "--out", str(out), "--samples", str(args.samples),
        "--max-new-tokens", str(args.max_new_tokens), "--devices", devices,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    reply = protocol.decode_reply(done.stdout)
    if not isinstance(reply, protocol.Reply) or not reply.ok:
        raise SystemExit(f"prepare failed: {done.stdout[-500:]} {done.stderr[-1500:]}")
    return {"samples": reply.data["stats"]["samples"], "heldout": reply.data.get("heldout")}


def train(args: argparse.Namespace, data: Path, run_dir: Path, every: int) -> dict[str, Any]:
    device = args.device
    argv = [
        sys.executable, "-m", "dflash_train", "train", "--target-model", args.target_model,
        "--data-dir", str(data), "--output-dir", str(run_dir), "--target-gpus", device,
        "--drafter-gpus", device, "--max-steps", str(args.steps), "--save-every", "0",
        "--epochs", "1000", "--eval-every", str(every), "--eval-prompts", str(args.eval_prompts),
        "--eval-tokens", str(args.eval_tokens), *args.train_args,
    ]  # fmt: skip
    started = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    lines = _lines(run_dir)
    if done.returncode != 0 or lines[-1].kind != "run_end":
        raise SystemExit(f"train failed (rc {done.returncode}): {done.stderr[-2000:]}")
    steps = [line for line in lines if line.kind == "step"]
    steady = [s for s in steps if s["step"] > args.skip]
    if len(steady) < 2:  # a rate needs two step lines after the warm-up
        raise SystemExit(f"--steps must exceed --skip ({args.skip}) by at least 2 step lines")
    first, last = steady[0], steady[-1]
    tokens = last["tokens"] - first["tokens"]
    wall = last.t - first.t
    evals = [line for line in lines if line.get("code") == "eval"]
    failed = [line["message"] for line in lines if line.get("code") == "eval_failed"]
    return {
        "eval_every": every,
        "wall_s": round(time.time() - started, 1),
        "steady_steps": f"{first['step']}..{last['step']}",
        "steady_tok_s": round(tokens / wall, 1),
        "step_s": round(wall / (last["step"] - first["step"]), 4),
        "evals": [
            {
                k: e.get(k)
                for k in ("step", "seconds", "tau", "tau_tf", "lossless", "dtype", "phases_s")
            }
            for e in evals
        ],
        "eval_failed": failed,
        "kernels": lines[0].get("kernels"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-model", default="smollm2")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--data-dir", help="prepared data with heldout.jsonl (default: prepare)")
    parser.add_argument("--samples", type=int, default=600, help="prepare's --samples")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="prepare's")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--eval-tokens", type=int, default=128)
    parser.add_argument("--skip", type=int, default=5, help="first steps left out (warm-up)")
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--out", type=Path)
    parser.add_argument("train_args", nargs="*", help="after --: more train options")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="eval-cost-") as tmp:
        root = Path(tmp)
        data = Path(args.data_dir) if args.data_dir else root / "data"
        made = None if args.data_dir else prepare(args, data)
        plain = train(args, data, root / "plain", 0)
        evaluated = train(args, data, root / "evaluated", args.eval_every)
    steady = [e["seconds"] for e in evaluated["evals"][1:]] or [
        e["seconds"] for e in evaluated["evals"]
    ]
    eval_s = statistics.mean(steady) if steady else None
    step_s = plain["step_s"]
    result = {
        "target_model": args.target_model,
        "device": args.device,
        "train_args": args.train_args or "defaults (the GPU recipe)",
        "eval_prompts": args.eval_prompts,
        "eval_tokens": args.eval_tokens,
        "prepared": made,
        "plain": plain,
        "evaluated": evaluated,
        "throughput_loss_measured_pct": round(
            100 * (1 - evaluated["steady_tok_s"] / plain["steady_tok_s"]), 2
        ),
        "steady_eval_s": None if eval_s is None else round(eval_s, 3),
        "default_interval_steps": DEFAULT_INTERVAL,
        "throughput_loss_at_default_interval_pct": None
        if eval_s is None
        else round(100 * eval_s / (DEFAULT_INTERVAL * step_s + eval_s), 2),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
