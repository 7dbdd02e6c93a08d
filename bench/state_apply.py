"""How long RunState takes to apply a 200,000-step history (CPU seconds), the figure the
console's attach path depends on. Writes
bench/results/console_sources_2core_<date>/state_apply.json.

    python bench/state_apply.py [--lines 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import date
from pathlib import Path

from dflash_train import protocol
from dflash_train.protocol import StatusLine
from dflash_tui.sources.state import RunState

STEP_FIELDS = {
    "epoch": 0,
    "epoch_progress": 0.5,
    "loss": 2.0,
    "acc": 0.5,
    "tau": 2.0,
    "lr": 1e-4,
    "grad_norm": 1.0,
    "tokens": 100,
    "ktok_s": 2.0,
}
GPU_FIELDS = {
    "available": True,
    "gpus": [{"index": 0, "role": "drafter", "util": 90.0, "power_w": 500.0}],
}


def history(count: int) -> list[StatusLine]:
    start = protocol.decode_line(
        protocol.encode_line(
            "run_start",
            seq=0,
            run="r1",
            t=1000.0,
            config={"epochs": 1},
            topology={"target_gpus": ["cpu"], "drafter_gpus": ["cpu"]},
            dataset={"samples": count},
            batches_per_epoch=count,
            total_steps=count,
            pid=1,
            host="box",
        )
    )
    assert isinstance(start, StatusLine), start
    lines = [start]
    for i in range(1, count + 1):
        kind = i % 10
        if kind < 7:
            lines.append(StatusLine(1, i, 1000.0 + i, "r1", "step", {**STEP_FIELDS, "step": i}))
        elif kind < 9:
            lines.append(StatusLine(1, i, 1000.0 + i, "r1", "gpu", GPU_FIELDS))
        else:
            lines.append(StatusLine(1, i, 1000.0 + i, "r1", "heartbeat", {}))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = history(args.lines)
    cpu_s = []
    for _ in range(args.rounds):
        state = RunState()
        started = time.process_time()
        for decoded in lines:
            state.apply(decoded)
        cpu_s.append(round(time.process_time() - started, 3))
    result = {
        "lines": len(lines),
        "cpu_s": cpu_s,
        "best_cpu_s": min(cpu_s),
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    folder = Path(__file__).parent / "results" / f"console_sources_2core_{date.today()}"
    out = args.out or folder / "state_apply.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
