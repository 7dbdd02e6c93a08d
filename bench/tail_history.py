"""Bench (not a test): write a synthetic 200,000-step status stream with a gpu and a queue
line every `--monitor-every` steps (default 1: the worst case), then time
`dflash-train tail RUN_DIR --history 400` end to end as a subprocess, and check that every
line it sends decodes and that the loss spike survives the decimation.

    .venv/bin/python bench/tail_history.py [--steps 200000] [--gpus 4] [--monitor-every 1]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile
import time

from dflash_train import protocol
from dflash_train.rundir import RunDir
from dflash_train.stream.writer import StatusWriter

SPIKE_STEP = 123_457
SPIKE_LOSS = 42.0


def write_stream(rundir: RunDir, steps: int, gpus: int, monitor_every: int) -> int:
    rng = random.Random(0)
    writer = StatusWriter(rundir.status, "bench0000001")
    writer.write(
        "run_start",
        config={"hs_queue_depth": 8, "hs_min_ready": 2},
        topology={"target_gpus": list(range(gpus - 1)), "drafter_gpus": [gpus - 1]},
        dataset={"samples": 100000},
        batches_per_epoch=steps // 6,
        total_steps=steps,
        pid=1,
        host="bench",
    )
    t0 = time.time() - steps
    for step in range(steps):
        t = t0 + step
        loss = 6.0 * math.exp(-step / 40000) + 0.3 * rng.random()
        if step == SPIKE_STEP % steps:
            loss = SPIKE_LOSS
        writer.write(
            "step",
            t=t,
            step=step,
            epoch=step * 6 // steps,
            epoch_progress=(step * 6 % steps) / steps,
            loss=loss,
            acc=1 - loss / 7,
            tau=1 + 5 * (1 - loss / 7),
            lr=6e-4,
            grad_norm=rng.random(),
            tokens=32768,
            ktok_s=40 + rng.random() * 5,
        )
        if step % monitor_every:
            continue
        writer.write(
            "queue",
            t=t,
            hs_ready=rng.randrange(9),
            hs_queue_depth=8,
            hs_min_ready=2,
            producer_wait=rng.random(),
            consumer_wait=rng.random(),
            starved=rng.random() * 0.1,
            bucket_mix={"short": 0.5, "long": 0.5},
        )
        readings = [
            {
                "index": i,
                "name": "NVIDIA H200",
                "role": "drafter" if i == gpus - 1 else "target",
                "util": rng.uniform(60, 100),
                "mem_used": rng.uniform(50000, 80000),
                "mem_total": 143771.0,
                "power_w": rng.uniform(300, 700),
                "power_limit_w": 700.0,
                "temp_c": rng.uniform(40, 80),
                "processes": [{"pid": 1000 + i, "gpu_mem": 60000.0}],
            }
            for i in range(gpus)
        ]
        writer.write("gpu", t=t, available=True, reason=None, gpus=readings)
        if step % 5000 == 0:
            path = f"checkpoints/step_{step:07d}"
            writer.write("checkpoint", t=t, step=step, path=path, seconds=2.0)
    writer.write("run_end", reason="completed", exit_code=0)
    writer.close()
    return writer.next_seq


def done_cpu(before: os.times_result) -> float:
    """CPU seconds of finished children since `before`: on a shared box, the wall time
    mostly measures the neighbours."""
    now = os.times()
    return (now.children_user - before.children_user) + (
        now.children_system - before.children_system
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--points", type=int, default=400)
    parser.add_argument("--monitor-every", type=int, default=1, help="steps per gpu/queue line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
        rundir = RunDir.at(tmp)
        started = time.perf_counter()
        lines = write_stream(rundir, args.steps, args.gpus, args.monitor_every)
        size = rundir.status.stat().st_size
        print(f"wrote {lines} lines, {size / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s")
        argv = [sys.executable, "-m", "dflash_train", "tail", str(rundir.root)]
        argv += ["--history", str(args.points)]
        started = time.perf_counter()
        started_cpu = os.times()
        done = subprocess.run(argv, capture_output=True, check=True)
        elapsed = time.perf_counter() - started
        kinds: dict[str, int] = {}
        peak = 0.0
        for raw in done.stdout.splitlines():
            decoded = protocol.decode_line(raw)
            assert isinstance(decoded, protocol.StatusLine), decoded
            kinds[decoded.kind] = kinds.get(decoded.kind, 0) + 1
            if decoded.kind == "step":
                peak = max(peak, decoded["loss"])
        assert peak == SPIKE_LOSS, f"the loss spike was lost: max {peak}"
        cpu = done_cpu(started_cpu)
        print(
            f"tail --history {args.points}: {elapsed:.2f} s end to end ({cpu:.2f} s CPU), "
            f"sent {sum(kinds.values())} lines {kinds}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
