"""Monitor overhead for the speed suite: the async pipeline (target worker thread -> pool ->
drafter) with the monitor off and on, alternating, target and drafter on one device."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch
from speed_drafter import DrafterRig, _dtype, _sync, drafter_config

from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.pipeline.target_workers import HiddenBatch


def monitor_overhead(
    target: Any,
    recipe: dict[str, int],
    seconds: float,
    rounds: int,
    device: torch.device,
    dims: str = "qwen3-8b",
    seq: int = 2048,
) -> dict[str, Any]:
    """Async pipeline (target worker thread -> pool -> drafter) with the monitor off and on,
    alternating, on one GPU: the rate lost with the monitor on."""
    from pipeline import MemoryLoader

    from dflash_train.pipeline.monitor import MonitorIntervals, MonitorThread, StepRecord
    from dflash_train.pipeline.pool import HiddenStatePool
    from dflash_train.pipeline.sources import AsyncSource, EpochPlan
    from dflash_train.stream.writer import StatusWriter
    from dflash_train.targets.frozen_target import Target

    config = drafter_config(dims, recipe["draft_layers"], 16)
    rig = DrafterRig(
        config, recipe["rows"], seq, recipe["anchors"], device, target.embed_tokens, target.lm_head
    )
    rig.stepper.warm_up([(rig.rows, rig.seq)], _dtype(device))
    loader = MemoryLoader(rig.rows, seq, target.vocab_size, pin=device.type == "cuda")
    plan = EpochPlan(0, [[0]] * 10**6, list(range(10**6)))
    layer_ids = list(config.target_layer_ids)
    assert isinstance(target, Target)

    def section(with_monitor: bool) -> float:
        pool: HiddenStatePool[HiddenBatch] = HiddenStatePool(4, 2)
        timers = StageTimers()
        source = AsyncSource(
            loader,
            [target],
            layer_ids=layer_ids,
            drafter_device=device,  # type: ignore[arg-type]
            timers=timers,
            pool=pool,
        )
        monitor = None
        if with_monitor:
            status = os.path.join(tempfile.mkdtemp(), "status.jsonl")
            from pathlib import Path

            monitor = MonitorThread(
                StatusWriter(Path(status), "bench"),
                block_size=16,
                max_bad_steps=10**9,
                on_fatal=lambda _m: None,
                timers=timers,
                pool=pool,
                producers=1,
                gpu_roles={device.index or 0: "target+drafter"},
                allocator_devices=(device,) if device.type == "cuda" else (),
                intervals=MonitorIntervals(profile=5.0),
            )
            monitor.start()
        batches = source.batches(plan, lambda: False)
        try:
            for _ in range(2):  # fill the pool, settle
                hb = next(batches)
                hb.wait_ready(device)
                rig.stepper.step(hb, 0)
            _sync(device)
            tokens, n, start = 0, 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                hb = next(batches)
                hb.wait_ready(device)
                rig.stepper.step(hb, 0)
                n += 1
                tokens += hb.tokens
                if monitor is not None:
                    monitor.submit_step(
                        StepRecord(
                            n,
                            0,
                            0.0,
                            rig.stepper.lr,
                            tokens,
                            hb.tokens,
                            time.monotonic(),
                            rig.stepper.snapshot(),
                        )
                    )
            _sync(device)
            return tokens / (time.perf_counter() - start) / 1e3
        finally:
            batches.close()
            source.close()
            if monitor is not None:
                monitor.stop()

    off, on = [], []
    for _ in range(rounds):
        off.append(round(section(False), 3))
        on.append(round(section(True), 3))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "recipe": recipe,
        "ktok_s_off": off,
        "ktok_s_on": on,
        "monitor_overhead": round(1 - sum(on) / sum(off), 4),
        "per_round": [round(1 - b / a, 4) for a, b in zip(off, on, strict=True)],
    }
