"""Optional Weights & Biases logging that can never stall training: the monitor hands
figures to a bounded queue, a daemon thread owns the wandb run, and a full queue drops."""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_STOP = object()


class WandbLogger:
    """`log` never blocks; the first call of wandb.init happens on the logger's own thread.
    Without WANDB_API_KEY the run is offline, under `run_dir/wandb`."""

    def __init__(
        self,
        *,
        project: str,
        run_dir: Path,
        run_id: str,
        config: Mapping[str, Any],
        max_pending: int = 1024,
    ) -> None:
        self.project = project
        self.run_dir = run_dir
        self.run_id = run_id
        self.config = dict(config)
        self.offline = not os.environ.get("WANDB_API_KEY")
        self.dropped = 0
        self.error: str | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._work, name="wandb-log", daemon=True)
        self._thread.start()

    def log(self, figures: Mapping[str, Any], step: int | None) -> None:
        try:
            self._queue.put_nowait((dict(figures), step))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 60.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)

    def _work(self) -> None:
        run = None
        try:
            import wandb

            run = wandb.init(
                project=self.project,
                id=self.run_id,
                name=self.run_id,
                resume="allow",
                dir=str(self.run_dir),
                config=self.config,
                mode="offline" if self.offline else "online",
                settings=wandb.Settings(console="off", silent=True),
            )
        except Exception as exc:  # W&B trouble must never end training
            self.error = f"wandb init failed: {exc}"
            print(self.error, file=sys.stderr)
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if run is None:
                continue
            figures, step = item
            try:
                run.log(figures, step=step)
            except Exception as exc:
                self.error = f"wandb log failed: {exc}"
        if run is not None:
            with contextlib.suppress(Exception):
                run.finish()
