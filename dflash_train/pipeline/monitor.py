"""MonitorThread: the only writer of the status stream while training runs. It turns the
drafter's asynchronous metric snapshots into `step` lines, samples the pool, GPUs and stage
timers, polls control.json, sends heartbeats, and mirrors figures to W&B."""

from __future__ import annotations

import collections
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_train.pipeline.control_watch import ControlWatcher
from dflash_train.pipeline.drafter_step import MetricsSnapshot, decode_interval
from dflash_train.pipeline.pool import HiddenStatePool, PoolStats
from dflash_train.pipeline.run_dir_watch import RunDirWatch
from dflash_train.pipeline.split_advice import SplitAdvisor
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.pipeline.wandb_log import WandbLogger
from dflash_train.stream.eval_inbox import EvalInbox
from dflash_train.stream.writer import StatusWriter


@dataclass(frozen=True)
class StepRecord:
    """What the drafter loop knows about a log interval on the host, plus its device sums."""

    step: int
    epoch: int
    epoch_progress: float
    lr: float
    tokens_total: int
    tokens_interval: int
    at: float  # time.monotonic() when the interval's last step was queued
    metrics: MetricsSnapshot


@dataclass(frozen=True)
class MonitorIntervals:
    tick: float = 0.2
    queue: float = 2.0
    gpu: float = 5.0
    control: float = 1.0
    heartbeat: float = 5.0
    run_dir: float = 5.0
    profile: float = 30.0
    # With no training progress for this long the monitor falls silent (after one warning
    # event), so `status` sees the stream go quiet and calls the run stalled.
    stall: float = 300.0
    # A side of the async pipeline waiting this long on the other gets a split_advice event.
    advice: float = 600.0


class MonitorThread(threading.Thread):
    def __init__(
        self,
        writer: StatusWriter | None,
        *,
        block_size: int,
        max_bad_steps: int,
        on_fatal: Callable[[str], None],
        timers: StageTimers,
        pool: HiddenStatePool[Any] | None = None,
        settings: Callable[[], Mapping[str, int]] = dict,
        producers: int = 1,
        control: ControlWatcher | None = None,
        gpu_roles: Mapping[int, str] | None = None,
        allocator_devices: tuple[Any, ...] = (),
        wandb: WandbLogger | None = None,
        intervals: MonitorIntervals | None = None,
        start_time: float | None = None,
        eval_inbox: EvalInbox | None = None,
        run_dir_watch: RunDirWatch | None = None,
        on_orphaned: Callable[[str], None] = lambda reason: None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(name="monitor", daemon=True)
        self.writer = writer
        self.block_size = block_size
        self.max_bad_steps = max_bad_steps
        self.on_fatal = on_fatal
        self.timers = timers
        self.pool = pool
        self.settings = settings
        self.producers = max(1, producers)
        self.control = control
        self.gpu_roles = dict(gpu_roles or {})
        self.allocator_devices = allocator_devices
        self.wandb = wandb
        self.intervals = intervals or MonitorIntervals()
        self.eval_inbox = eval_inbox
        self.run_dir_watch = run_dir_watch
        self.on_orphaned = on_orphaned
        self.on_step = on_step  # the foreground's progress line (train's stderr)
        self.advisor = SplitAdvisor.for_roles(self.gpu_roles, sustain=self.intervals.advice)
        self.orphaned: str | None = None  # why the run dir is gone; then nothing is written
        self._items: collections.deque[StepRecord | tuple[str, dict[str, Any]]] = (
            collections.deque()
        )
        self._cond = threading.Condition()
        self._stopping = False
        self._last_step_at = start_time if start_time is not None else time.monotonic()
        self._last_pool: tuple[float, PoolStats] | None = None
        self._due: dict[str, float] = {}
        self._progress_at = time.monotonic()
        self._silent = False
        self.errors = 0
        # W&B wants monotonic steps: queue and gpu figures go under the latest train step.
        self._wandb_step = 0

    # -- called from the training thread ------------------------------------------------
    def mark_start(self) -> None:
        """The first interval's throughput counts from here (not from model loading)."""
        self._last_step_at = time.monotonic()
        self.touch()

    def touch(self) -> None:
        """The training loop is alive (a step, a checkpoint, an epoch boundary)."""
        self._progress_at = time.monotonic()

    def submit_step(self, record: StepRecord) -> None:
        self.touch()
        with self._cond:
            self._items.append(record)
            self._cond.notify()

    def emit(self, kind: str, **fields: Any) -> None:
        """Queue a line (checkpoint, event, ...) so it is written in order by this thread."""
        with self._cond:
            self._items.append((kind, fields))
            self._cond.notify()

    def stop(self, timeout: float = 120.0) -> None:
        """Write everything queued, then end. The caller writes run_end afterwards."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.join(timeout)

    # -- the thread ---------------------------------------------------------------------
    def run(self) -> None:
        while True:
            with self._cond:
                if not self._items and not self._stopping:
                    self._cond.wait(self.intervals.tick)
                stopping = self._stopping
            try:
                self._drain(final=stopping)
                if stopping:
                    return
                self._periodic()
            except Exception:
                # The monitor must outlive a bad sample; the traceback goes to train.log.
                self.errors += 1
                traceback.print_exc(file=sys.stderr)
                if stopping:
                    return

    def _drain(self, *, final: bool) -> None:
        while True:
            with self._cond:
                if not self._items:
                    return
                head = self._items[0]
            if isinstance(head, StepRecord):
                ready = head.metrics.ready
                if ready is not None and not final and not ready.query():
                    return  # the device has not reached it yet: keep order, try next tick
                self._write_step(head)
            else:
                kind, fields = head
                self._write(kind, **fields)
                if kind == "event" and fields.get("code") == "eval":
                    self._log_eval(fields)
            with self._cond:
                self._items.popleft()

    def check_run_dir(self) -> str | None:
        """Why the run dir is no longer this run's (then the run is told, once), or None.
        Periodic, and right before a checkpoint: an epoch's end may come between the
        deletion and the next periodic look."""
        watch = self.run_dir_watch
        if watch is not None and self.orphaned is None:
            self.orphaned = watch.gone()
            if self.orphaned is not None:
                self.on_orphaned(self.orphaned)
        return self.orphaned

    def _due_now(self, name: str, every: float, now: float) -> bool:
        if now >= self._due.get(name, 0.0):
            self._due[name] = now + every
            return True
        return False

    def _periodic(self) -> None:
        now = time.monotonic()
        iv = self.intervals
        if self.orphaned is None and self._due_now("run_dir", iv.run_dir, now):
            self.check_run_dir()
        if self.orphaned is not None:
            return
        if self.control is not None and self._due_now("control", iv.control, now):
            self._poll_control()
        if self.eval_inbox is not None and self._due_now("eval_inbox", iv.control, now):
            for fields in self.eval_inbox.take():  # `dflash-train eval --run-dir`, by hand
                self._write("event", **fields)
                self._log_eval(fields)
        if self._quiet_for_stall(now):
            return
        if self._due_now("queue", iv.queue, now):
            self._write_queue(now)
        if self._due_now("gpu", iv.gpu, now):
            self._write_gpu()
        # The first profile waits a full interval so it covers real work.
        self._due.setdefault("profile", now + iv.profile)
        if self._due_now("profile", iv.profile, now):
            self._write_profile()
        notice = self.wandb.take_notice() if self.wandb is not None else None
        if notice is not None:
            self._write("event", **notice)
        if self.writer is not None and now - self.writer.last_write >= iv.heartbeat:
            self._write("heartbeat")

    def _quiet_for_stall(self, now: float) -> bool:
        """Periodic lines would hide a hung training loop from `status`: after `stall`
        seconds without progress, warn once and write nothing periodic until it moves."""
        idle = now - self._progress_at
        if idle < self.intervals.stall:
            self._silent = False
            return False
        if not self._silent:
            self._silent = True
            self._write(
                "event",
                level="warning",
                code="no_progress",
                message=f"no training progress for {idle:.0f} s; periodic lines paused",
            )
        return True

    # -- lines --------------------------------------------------------------------------
    def _write(self, kind: str, **fields: Any) -> None:
        if self.writer is not None and self.orphaned is None:
            self.writer.write(kind, **fields)

    def _write_step(self, record: StepRecord) -> None:
        figures = decode_interval(record.metrics.wait(), self.block_size)
        elapsed = max(1e-9, record.at - self._last_step_at)
        self._last_step_at = record.at
        ktok_s = record.tokens_interval / elapsed / 1000.0
        tau = figures.tau
        fields = {
            "step": record.step,
            "epoch": record.epoch,
            "epoch_progress": round(record.epoch_progress, 6),
            "loss": figures.loss,
            "acc": figures.acc,
            "tau": tau,
            "lr": record.lr,
            "grad_norm": figures.grad_norm,
            "tokens": record.tokens_total,
            "ktok_s": round(ktok_s, 3),
            "steps": figures.steps,
            "bad_steps": figures.bad_steps,
            "slot_acc": [round(a, 4) for a in figures.slot_acc],
        }
        self._write("step", **fields)
        if self.advisor is not None and figures.steps:
            self.advisor.observe_tokens(record.tokens_interval / figures.steps)
        if self.on_step is not None:
            self.on_step(fields)
        self._wandb_step = record.step
        if self.wandb is not None:
            wanted = ("loss", "acc", "tau", "lr", "grad_norm", "tokens", "ktok_s", "epoch")
            self.wandb.log(
                {f"train/{k}": fields[k] for k in wanted if fields[k] is not None}, record.step
            )
        if figures.bad_steps:
            self._write(
                "event",
                level="error",
                code="nonfinite_step",
                message=f"non-finite loss or gradients: {figures.bad_steps} step(s) up to "
                f"step {record.step} skipped ({figures.max_streak} in a row)",
                step=record.step,
            )
        if figures.max_streak >= self.max_bad_steps:
            self.on_fatal(
                f"{figures.max_streak} non-finite steps in a row (--max-bad-steps "
                f"{self.max_bad_steps}) at step {record.step}"
            )

    def _log_eval(self, fields: dict[str, Any]) -> None:
        """W&B gets a held-out evaluation's numbers under its step."""
        if self.wandb is None:
            return
        names = ("tau", "tau_tf", "tau_tf_seen", "mismatched", "seconds")
        figures = {f"eval/{k}": fields[k] for k in names if fields.get(k) is not None}
        if fields.get("lossless") is not None:  # None: a hybrid's, nothing decoded
            figures["eval/lossless"] = int(bool(fields["lossless"]))
        self.wandb.log(figures, max(self._wandb_step, int(fields.get("step", 0))))

    def _write_queue(self, now: float) -> None:
        settings = dict(self.settings())
        if self.pool is None:
            fields: dict[str, Any] = {
                "hs_ready": 0,
                "hs_queue_depth": settings.get("hs_queue_depth", 0),
                "hs_min_ready": settings.get("hs_min_ready", 0),
                "producer_wait": 0.0,
                "consumer_wait": 0.0,
                "starved": 0.0,
                "bucket_mix": {},
                "pipeline": "sync",
            }
        else:
            stats = self.pool.stats()
            prev = self._last_pool
            self._last_pool = (now, stats)
            if prev is None:
                return
            span = max(1e-9, now - prev[0])
            takes = stats.takes - prev[1].takes
            starved = (stats.starved_takes - prev[1].starved_takes) / takes if takes else 0.0
            producer = (stats.producer_wait_s - prev[1].producer_wait_s) / span / self.producers
            consumer = (stats.consumer_wait_s - prev[1].consumer_wait_s) / span
            fields = {
                "hs_ready": stats.ready,
                "hs_queue_depth": stats.depth,
                "hs_min_ready": stats.min_ready,
                "producer_wait": round(min(1.0, producer), 4),
                "consumer_wait": round(min(1.0, consumer), 4),
                "starved": round(starved, 4),
                "bucket_mix": stats.bucket_mix,
                "pipeline": "async",
                "batches_in": stats.puts - prev[1].puts,
                "batches_out": takes,
            }
        self._write("queue", **fields)
        if self.advisor is not None and self.pool is not None:
            self.advisor.observe_queue(now, fields["producer_wait"], fields["consumer_wait"])
        if self.wandb is not None:
            keys = ("hs_ready", "producer_wait", "consumer_wait", "starved")
            self.wandb.log({f"queue/{k}": fields[k] for k in keys}, self._wandb_step)

    def _write_gpu(self) -> None:
        from dflash_train.gpu_telemetry import sample_gpus

        sample = sample_gpus(self.gpu_roles, processes=False)
        gpus = [
            {k: v for k, v in gpu.items() if k != "processes"} for gpu in sample.get("gpus", [])
        ]
        self._write("gpu", available=bool(sample["available"]), reason=sample["reason"], gpus=gpus)
        if self.wandb is not None and gpus:
            figures = {}
            for gpu in gpus:
                for key in ("util", "mem_used", "power_w"):
                    if gpu.get(key) is not None:
                        figures[f"gpu{gpu['index']}/{key}"] = gpu[key]
            self.wandb.log(figures, self._wandb_step)

    def _write_profile(self) -> None:
        stages = self.timers.collect()
        allocator: dict[str, Any] = {}
        if self.allocator_devices:
            import torch

            for device in self.allocator_devices:
                stats = torch.cuda.memory_stats(device)
                allocator[str(device)] = {
                    "allocated_mb": round(stats.get("allocated_bytes.all.current", 0) / 2**20, 1),
                    "reserved_mb": round(stats.get("reserved_bytes.all.current", 0) / 2**20, 1),
                    "peak_mb": round(stats.get("allocated_bytes.all.peak", 0) / 2**20, 1),
                    "alloc_retries": stats.get("num_alloc_retries", 0),
                    "ooms": stats.get("num_ooms", 0),
                }
        self._write("profile", stages_ms=stages, allocator=allocator)
        if self.advisor is not None:
            self.advisor.observe_profile(stages)
            advice = self.advisor.advice(time.monotonic())
            if advice is not None:
                self._write("event", level="info", code="split_advice", **advice)

    def _poll_control(self) -> None:
        assert self.control is not None
        outcome = self.control.poll()
        if outcome is None:
            return
        if outcome.applied:
            self._write(
                "event",
                level="info",
                code="control_applied",
                message=outcome.message,
                rev=outcome.rev,
                settings=outcome.settings,
            )
        else:
            self._write(
                "event",
                level="warning",
                code="control_rejected",
                message=outcome.message,
                rev=outcome.rev,
            )
