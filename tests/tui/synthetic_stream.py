"""Writes a deterministic status stream (fixed times, smooth curves, 8 GPUs) into a run
directory, so console snapshots are stable and the bench can attach to 200,000 steps."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from dflash_train import protocol

RUN_ID = "a1b2c3d4e5f6"
T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
TARGET_GPUS = (0, 1, 2, 3, 4)
DRAFTER_GPUS = (5, 6, 7)


def step_fields(step: int, steps_per_epoch: int, epochs: int) -> dict[str, object]:
    epoch, within = divmod(step, steps_per_epoch)
    loss = 1.6 + 6.5 * math.exp(-step / (steps_per_epoch * 0.6)) + 0.15 * math.sin(step / 7)
    acc = max(0.0, min(1.0, 0.72 - 0.6 * math.exp(-step / steps_per_epoch)))
    return {
        "step": step,
        "epoch": min(epoch, epochs - 1),  # 0-based, as the trainer writes it
        "epoch_progress": within / steps_per_epoch,
        "loss": round(loss, 4),
        "acc": round(acc, 4),
        "tau": round(1 + sum(acc**k for k in range(1, 16)), 3),
        "lr": 6e-4,
        "grad_norm": 0.8,
        "tokens": 65536,
        "ktok_s": round(118 + 9 * math.sin(step / 23) + 3 * math.cos(step / 5), 2),
    }


def gpu_fields(tick: int) -> dict[str, object]:
    gpus = []
    for index in range(8):
        role = "drafter" if index in DRAFTER_GPUS else "target"
        util = 96 - 3 * index + 2 * math.sin((tick + index) / 3)
        gpus.append(
            {
                "index": index,
                "name": "NVIDIA H200",
                "role": role,
                "util": round(util if index != 4 else 22 + 4 * math.sin(tick / 5), 1),
                "mem_used": 121000.0 + 900 * index if role == "target" else 83000.0,
                "mem_total": 143771.0,
                "power_w": round(640 - 9 * index, 1),
                "power_limit_w": 700.0,
                "temp_c": 71.0 + index + (8 if index == 2 else 0),
            }
        )
    return {"available": True, "reason": None, "gpus": gpus}


def queue_fields(tick: int) -> dict[str, object]:
    return {
        "hs_ready": 5 + tick % 3,
        "hs_queue_depth": 8,
        "hs_min_ready": 3,
        "producer_wait": 0.12,
        "consumer_wait": 0.03,
        "starved": 0.021,
        "bucket_mix": {"<=512": 41, "<=1024": 33, "<=2048": 18, "<=4096": 8},
    }


def lines(
    steps: int, *, epochs: int = 6, monitor_every: int = 10, seconds_per_step: float = 0.5
) -> Iterator[str]:
    """The whole stream as protocol lines, in seq order."""
    steps_per_epoch = max(1, math.ceil(steps / epochs)) if steps else 1
    seq = 0

    def line(kind: str, t: float, **fields: object) -> str:
        nonlocal seq
        seq += 1
        return protocol.encode_line(kind, seq=seq - 1, run=RUN_ID, t=t, **fields)

    yield line(
        "run_start",
        T0,
        config={"target_model": "Qwen/Qwen3-8B", "epochs": epochs, "lr": 6e-4},
        topology={"target_gpus": list(TARGET_GPUS), "drafter_gpus": list(DRAFTER_GPUS)},
        dataset={"samples": 800_000, "padding_efficiency": 0.93},
        batches_per_epoch=steps_per_epoch,
        total_steps=steps_per_epoch * epochs,
        pid=4242,
        host="gpu-box",
    )
    for step in range(steps):
        t = T0 + 30 + step * seconds_per_step
        yield line("step", t, **step_fields(step, steps_per_epoch, epochs))
        if step % monitor_every == 0:
            tick = step // monitor_every
            yield line("queue", t, **queue_fields(tick))
            yield line("gpu", t, **gpu_fields(tick))
        if step and step % steps_per_epoch == 0:
            epoch = step // steps_per_epoch
            message = f"epoch {epoch}/{epochs} done"
            yield line("event", t, level="info", message=message, code="epoch_end")
        if step and step % 2000 == 0:
            path = f"checkpoints/step_{step:07d}"
            yield line("checkpoint", t, step=step, path=path, seconds=4.2)
    t_end = T0 + 30 + steps * seconds_per_step
    yield line(
        "event", t_end, level="info", message="hs_min_ready=3 applied", code="control_applied"
    )
    yield line(
        "event",
        t_end,
        level="warning",
        message="drafter starved 2.1% over the last minute",
        code="starved",
    )


def write_stream(run_dir: Path, steps: int, **kwargs: object) -> float:
    """Writes RUN_DIR/status.jsonl and returns the time of its last line."""
    run_dir.mkdir(parents=True, exist_ok=True)
    last_t = T0
    with (run_dir / "status.jsonl").open("w", encoding="utf-8") as fh:
        for text in lines(steps, **kwargs):  # type: ignore[arg-type]
            fh.write(text)
            last_t = float(text.split('"t":', 1)[1].split(",", 1)[0])
    return last_t
