"""Training time lost per checkpoint: the synchronous save (checkpoints.save_checkpoint on
the live drafter) against the asynchronous one (pinned host copies at the step boundary,
the write on a background thread: pipeline/async_checkpoint.py). Part of speed_suite."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dflash_train.checkpoint import store as checkpoints
from dflash_train.pipeline.async_checkpoint import AsyncCheckpointer


def checkpoint_stall(device: torch.device, dims: str, layers: int) -> dict[str, Any]:
    from speed_drafter import DrafterRig, drafter_config

    rig = DrafterRig(drafter_config(dims, layers, 16), 1, 256, 32, device)
    rig.step()  # AdamW's moments exist, as in a real run
    params = sum(p.numel() for p in rig.drafter.parameters())
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("DFLASH_BENCH_DISK")))
    rng = checkpoints.capture_rng([device])

    def state(step: int) -> checkpoints.TrainState:
        return checkpoints.TrainState(step=step, epoch=0, consumed=[], tokens_seen=0, run_id="b")

    stepper = rig.stepper
    start = time.perf_counter()
    checkpoints.save_checkpoint(
        root,
        drafter=rig.drafter,
        optimizer=stepper.optimizer,
        scheduler=stepper.scheduler,
        state=state(1),
        rng=rng,
        keep=3,
    )
    sync_s = time.perf_counter() - start
    writes: list[float] = []
    saver = AsyncCheckpointer(
        rig.drafter,
        stepper.optimizer,
        stepper.scheduler,
        on_done=lambda _p, _s, _stall, write_s: writes.append(write_s),
        on_error=lambda _s, exc: None,
    )
    for _ in range(3):  # the run trains on while the host buffers are pinned
        rig.step()
    stalls = []
    for step in (2, 3):
        rig.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stalls.append(saver.save(root, state(step), rng, keep=3))
        # Training goes on while the write runs: a few steps, as the loop would.
        t0 = time.perf_counter()
        while saver.busy:
            rig.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        overlap_s = time.perf_counter() - t0
        saver.wait()
    newest = checkpoints.latest_checkpoint(root)
    loaded = checkpoints.load_checkpoint(newest) if newest is not None else None
    shutil.rmtree(root, ignore_errors=True)
    return {
        "drafter_params_m": round(params / 1e6, 1),
        "sync_save_s": round(sync_s, 2),
        "stall_s": round(max(stalls[1:] or stalls), 3),
        "first_stall_s": round(stalls[0], 3),  # includes pinning the host buffers once
        "background_write_s": [round(w, 2) for w in writes],
        "trained_during_last_write_s": round(overlap_s, 2),
        "newest_loadable_step": loaded.state.step if loaded is not None else None,
    }
