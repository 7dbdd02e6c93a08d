"""How long `dflash-train report` takes on a long run: a synthetic stream of STEPS steps
(tests/tui/synthetic_stream.py: a gpu and a queue line every 10 steps, 8 GPUs, a checkpoint
every 2,000 steps) with held-out evaluations, a restart and alerts added, timed end to end
as a user runs it (a fresh process, HTML and --png), and the stream read alone. Wall
seconds and the child's CPU seconds (user + system) are both recorded: on a shared box the
wall time follows the load, the CPU time much less.

    python bench/report_speed.py --steps 200000 \\
        --out bench/results/report_2core_<date>/report_200k.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_train import protocol
from dflash_train.report.series import read_run
from tests.tui.synthetic_stream import RUN_ID, write_stream

ROOT = Path(__file__).resolve().parent.parent


def add_evals_restart_alerts(stream: Path, steps: int, last_t: float) -> None:
    """An eval event every 10,000 steps, one restart and two alerts, after the steps (the
    report places marks by their step, not their place in the file)."""
    seq = sum(1 for _ in stream.open("rb"))
    with stream.open("a", encoding="utf-8") as fh:
        for step in range(10_000, steps + 1, 10_000):
            fh.write(protocol.encode_line(
                "event", seq=seq, run=RUN_ID, t=last_t, level="info", code="eval",
                message=f"held-out tau at {step}", step=step, tau=2.0 + step / steps,
                tau_tf=2.2 + step / steps, lossless=True, prompts=16, tokens=128, seconds=40.0,
            ))  # fmt: skip
            seq += 1
        for level, code in (("warning", "starved"), ("error", "nonfinite_step")):
            fh.write(protocol.encode_line(
                "event", seq=seq, run=RUN_ID, t=last_t, level=level, code=code,
                message=f"{code} in the bench", step=steps // 2,
            ))  # fmt: skip
            seq += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        last_t = write_stream(run_dir, args.steps)
        stream = run_dir / "status.jsonl"
        add_evals_restart_alerts(stream, args.steps, last_t)
        start = time.perf_counter()
        series = read_run(stream)
        read_s = time.perf_counter() - start
        runs, cpu = [], []
        for _ in range(args.repeats):
            out = Path(tmp) / "report.html"
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "dflash_train.cli", "report", str(run_dir),
                 "--out", str(out), "--png"],
                check=True, capture_output=True, cwd=ROOT,
            )  # fmt: skip
            runs.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        result = {
            "steps": args.steps,
            "stream_lines": series.lines,
            "stream_mb": round(stream.stat().st_size / 1e6, 1),
            "checkpoints": len(series.checkpoints),
            "evals": len(series.evals),
            "alerts": len(series.alerts),
            "read_stream_s": round(read_s, 2),
            "report_s": [round(r, 2) for r in runs],
            "report_s_best": round(min(runs), 2),
            "report_cpu_s": [round(c, 2) for c in cpu],
            "html_kb": round(out.stat().st_size / 1e3, 1),
            "png_kb": round(out.with_suffix(".png").stat().st_size / 1e3, 1),
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
