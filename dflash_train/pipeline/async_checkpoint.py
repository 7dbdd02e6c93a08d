"""Checkpoints off the critical path: at the step boundary the drafter's weights and the
optimizer state are copied into pinned host buffers (a fraction of a second), and a
background thread writes them with checkpoints.save_checkpoint, which keeps its protocol
(temp dir, files, fsync, `complete` manifest last, rename). A SIGKILL mid-write leaves the
previous checkpoint the newest loadable one; `wait()` (called before the run ends, before
export, before the next save) makes a SIGTERM end with a complete checkpoint."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dflash_train.checkpoint import store as checkpoints


class _Frozen:
    """Stands in for the optimizer / scheduler in save_checkpoint: their captured state."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


@dataclass
class _Job:
    root: Path
    state: checkpoints.TrainState
    rng: dict[str, Any]
    keep: int
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    started: float
    within: Path | None


class AsyncCheckpointer:
    """One background write at a time; the host copies are reused between saves."""

    def __init__(
        self,
        drafter: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        on_done: Callable[[Path, checkpoints.TrainState, float, float], None],
        on_error: Callable[[checkpoints.TrainState, BaseException], None],
    ) -> None:
        self.drafter = drafter
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.on_done = on_done
        self.on_error = on_error
        self._shadow: torch.nn.Module | None = None  # CPU twin of the drafter, pinned
        self._opt_host: dict[int, dict[str, torch.Tensor]] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_stall_s = 0.0
        # Pinning ~12 bytes per parameter takes seconds (cudaHostAlloc): do it now, in the
        # background, so the first checkpoint does not wait for it.
        from dflash_train.model.drafter import DFlashDrafter, _unwrap

        model = _unwrap(drafter)
        with torch.device("meta"):
            self._meta = DFlashDrafter(model.config)
        self._pin = next(model.parameters()).is_cuda
        self._shapes = [
            (p.shape, p.dtype) for group in optimizer.param_groups for p in group["params"]
        ]
        self._prepared = threading.Thread(target=self._prepare, name="checkpoint-pin", daemon=True)
        self._prepared.start()

    def _prepare(self) -> None:
        shadow = self._meta.to_empty(device="cpu")
        if self._pin:
            for tensor in [*shadow.parameters(), *shadow.buffers()]:
                tensor.data = tensor.data.pin_memory()
        for index, (shape, dtype) in enumerate(self._shapes):
            # AdamW's moments, shaped like their parameter.
            self._opt_host[index] = {
                name: torch.empty(shape, dtype=dtype, pin_memory=self._pin)
                for name in ("exp_avg", "exp_avg_sq")
            }
        self._shadow = shadow

    # -- main thread --------------------------------------------------------------------
    def save(
        self,
        root: Path,
        state: checkpoints.TrainState,
        rng: dict[str, Any],
        keep: int,
        within: Path | None = None,
    ) -> float:
        """Capture now, write in the background. Returns the seconds training waited
        (a previous write still running, plus the copies). Raises a failed earlier write."""
        start = time.monotonic()
        self.wait()
        from dflash_train.model.compile_guard import GUARD

        with GUARD.held():  # reads the live modules: not beside another thread's compile
            optimizer, scheduler = self._capture()
        job = _Job(root, state, rng, keep, optimizer, scheduler, start, within)
        self._thread = threading.Thread(
            target=self._write, args=(job,), name="checkpoint-writer", daemon=True
        )
        self._thread.start()
        self.last_stall_s = time.monotonic() - start
        return self.last_stall_s

    def wait(self) -> None:
        """Block until the write in flight is on disk; re-raise its failure here."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _capture(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from dflash_train.model.drafter import _unwrap

        model = _unwrap(self.drafter)
        pin = self._pin
        self._prepared.join()
        assert self._shadow is not None
        with torch.no_grad():
            host = self._shadow.state_dict()
            for name, value in model.state_dict().items():
                host[name].copy_(value, non_blocking=pin)
        opt = self.optimizer.state_dict()
        host_state: dict[int, dict[str, Any]] = {}
        for key, entry in opt["state"].items():
            held = self._opt_host.setdefault(key, {})
            copied: dict[str, Any] = {}
            for name, value in entry.items():
                if isinstance(value, torch.Tensor):
                    buf = held.get(name)
                    if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                        buf = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
                        held[name] = buf
                    buf.copy_(value, non_blocking=pin)
                    copied[name] = buf
                else:
                    copied[name] = value
            host_state[key] = copied
        if pin:
            torch.cuda.synchronize()
        optimizer = {"state": host_state, "param_groups": opt["param_groups"]}
        return optimizer, self.scheduler.state_dict()

    # -- writer thread ------------------------------------------------------------------
    def _write(self, job: _Job) -> None:
        assert self._shadow is not None
        begun = time.monotonic()
        try:
            path = checkpoints.save_checkpoint(
                job.root,
                drafter=self._shadow,
                optimizer=_Frozen(job.optimizer),
                scheduler=_Frozen(job.scheduler),
                state=job.state,
                rng=job.rng,
                keep=job.keep,
                within=job.within,
            )
        except BaseException as exc:
            self._error = exc
            self.on_error(job.state, exc)
            return
        self.on_done(path, job.state, self.last_stall_s, time.monotonic() - begun)
