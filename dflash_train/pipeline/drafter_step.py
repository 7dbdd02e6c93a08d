"""One optimizer step of the drafter on a hidden-state batch, with every figure kept on
the device: non-finite steps are skipped by a found-inf flag inside the fused AdamW
kernel, and metrics accumulate in a device buffer the monitor copies out asynchronously."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_train.model.compile_guard import GUARD

if TYPE_CHECKING:
    import torch

    from dflash_train.pipeline.sources import HiddenBatch
    from dflash_train.pipeline.stage_timers import StageTimers

# Layout of the metrics buffer: scalars, then LossOutput.slot_sums() flattened (slot_correct,
# slot_total, run_correct and run_total, [B-1] each).
LOSS_SUM, GRAD_NORM_SUM, STEPS, GOOD_STEPS, BAD_STEPS, MAX_STREAK = range(6)
N_SCALARS = 6
N_SLOT_SUMS = 4


@dataclass(frozen=True)
class StepConfig:
    lr: float
    weight_decay: float
    warmup_steps: int
    total_steps: int
    grad_clip: float
    block_size: int
    num_anchors: int
    seed: int
    # > 0: batch.context carries the target's final hidden states as its last hidden_size
    # columns (the teacher of dflash_forward_loss), after the drafter's context layers.
    distill: float = 0.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """Host copies of one log interval's sums, valid once `ready` has completed. `release`
    hands the pinned buffer and its event back to the stepper's free list once read."""

    values: torch.Tensor
    ready: Any | None
    release: Callable[[], None] | None = field(default=None, compare=False)

    def wait(self) -> list[float]:
        if self.ready is not None:
            self.ready.synchronize()
        out = self.values.tolist()
        if self.release is not None:
            self.release()
        return out


class _PinnedSlots:
    """Reused (pinned host buffer, CUDA event) pairs for snapshots: a snapshot per log
    interval then costs one async copy and one event record, no pinned allocation (which
    goes through cudaHostAlloc when the host cache is cold) and no event creation."""

    def __init__(self, shape: tuple[int, ...], limit: int = 64) -> None:
        self.shape = shape
        self.limit = limit
        self._free: collections.deque[tuple[Any, Any]] = collections.deque()
        self._lock = threading.Lock()

    def take(self) -> tuple[Any, Any]:
        import torch

        with self._lock:
            if self._free:
                return self._free.popleft()
        host = torch.empty(self.shape, dtype=torch.float32, pin_memory=True)
        return host, torch.cuda.Event()

    def give_back(self, slot: tuple[Any, Any]) -> None:
        with self._lock:
            if len(self._free) < self.limit:
                self._free.append(slot)


def anchor_seed(seed: int, epoch: int, position: int) -> int:
    """Anchors depend only on (seed, epoch, batch position): the same batch gets the same
    anchors whatever order it is drawn in and whether the run was resumed."""
    return (seed * 1_000_003 + epoch * 100_003 + position) % (2**63 - 1)


class DrafterStepper:
    def __init__(
        self,
        model: torch.nn.Module,
        drafter: torch.nn.Module,
        *,
        embed_tokens: torch.nn.Module,
        lm_head: torch.nn.Module,
        config: StepConfig,
        device: torch.device,
        timers: StageTimers,
    ) -> None:
        import torch
        from transformers import get_cosine_schedule_with_warmup

        self.model = model  # the DDP wrapper when distributed, else the drafter itself
        self.drafter = drafter
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.config = config
        self.device = device
        self.timers = timers
        params = [p for p in drafter.parameters() if p.requires_grad]
        self.params = params
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, weight_decay=config.weight_decay, fused=True
        )
        self.scheduler = get_cosine_schedule_with_warmup(
            self.optimizer, config.warmup_steps, max(1, config.total_steps)
        )
        slots = config.block_size - 1
        self._metrics = torch.zeros(
            N_SCALARS + N_SLOT_SUMS * slots, device=device, dtype=torch.float32
        )
        self._streak = torch.zeros((), device=device, dtype=torch.float32)
        self._pinned = device.type == "cuda"
        self._slots = _PinnedSlots(tuple(self._metrics.shape)) if self._pinned else None
        self._generator = torch.Generator(device=device)
        self._last_lr = float(self.scheduler.get_last_lr()[0])

    @property
    def lr(self) -> float:
        """The learning rate the latest step used."""
        return self._last_lr

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, batch: HiddenBatch, epoch: int) -> None:

        # Any step may compile (a new shape, a dynamo recompile): no other thread may run
        # modules meanwhile (compile_guard.py says why).
        with GUARD.held():
            self._step(batch, epoch)

    def _step(self, batch: HiddenBatch, epoch: int) -> None:
        import torch

        from dflash_train.model.dflash_loss import dflash_forward_loss, sample_anchors

        cfg = self.config
        self._generator.manual_seed(anchor_seed(cfg.seed, epoch, batch.position))
        with self.timers.time("drafter_fwd_bwd", self.device):
            anchors, valid = sample_anchors(
                batch.loss_mask, cfg.num_anchors, cfg.block_size, self._generator
            )
            context, teacher = self._split(batch.context)
            with self._autocast():
                out = dflash_forward_loss(
                    self.model,
                    self.embed_tokens,
                    self.lm_head,
                    context,
                    batch.input_ids,
                    batch.loss_mask,
                    anchors,
                    valid,
                    teacher,
                    cfg.distill,
                )
            out.loss.backward()
        with self.timers.time("optimizer", self.device):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip, foreach=True)
            loss = out.loss.detach().float()
            bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
            # The fused kernel reads this flag on the device and leaves weights, moments and
            # its step count untouched when it is set: a skipped step without a host sync.
            self.optimizer.found_inf = bad.float().reshape(())
            self._last_lr = float(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            self._accumulate(loss, grad_norm.float(), bad, out)

    def _split(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.config.distill <= 0:
            return context, None
        width = self.drafter.config.hidden_size
        return context[..., :-width], context[..., -width:]

    def _accumulate(
        self, loss: torch.Tensor, grad_norm: torch.Tensor, bad: torch.Tensor, out: Any
    ) -> None:
        import torch

        good = (~bad).float()
        zero = torch.zeros((), device=self.device)
        self._streak.mul_(bad.float()).add_(bad.float())
        m = self._metrics
        m[LOSS_SUM] += torch.where(bad, zero, loss)
        m[GRAD_NORM_SUM] += torch.where(bad, zero, grad_norm)
        m[STEPS] += 1.0
        m[GOOD_STEPS] += good
        m[BAD_STEPS] += bad.float()
        m[MAX_STREAK] = torch.maximum(m[MAX_STREAK], self._streak)
        m[N_SCALARS:] += torch.where(bad, 0.0, out.slot_sums().detach().float().flatten())

    def snapshot(self) -> MetricsSnapshot:
        """Start copying the interval's sums to the host and reset them (no host sync)."""
        import torch

        if self._slots is not None:
            slot = self._slots.take()
            host, event = slot
            host.copy_(self._metrics, non_blocking=True)
            event.record(torch.cuda.current_stream(self.device))
            self._metrics.zero_()
            slots = self._slots
            return MetricsSnapshot(host, event, lambda: slots.give_back(slot))
        host = self._metrics.clone()
        self._metrics.zero_()
        return MetricsSnapshot(host, None)

    def warm_up(self, shapes: list[tuple[int, int]], context_dtype: Any) -> float:
        """Run forward + backward once per (rows, length) shape on made-up tokens, then drop
        the gradients: compiles the attention kernel for those shapes here, on the calling
        (main) thread, before any worker starts. Touches no weights, optimizer state,
        metrics or global RNG. Returns the seconds it took."""
        import torch

        from dflash_train.model.dflash_loss import dflash_forward_loss, sample_anchors

        cfg = self.config
        core = self.drafter
        teachers = 1 if cfg.distill > 0 else 0
        width = (len(core.config.target_layer_ids) + teachers) * core.config.hidden_size
        vocab = int(self.embed_tokens.weight.shape[0])
        gen = torch.Generator(device=self.device).manual_seed(0)
        start = time.perf_counter()
        for rows, length in shapes:  # before any worker exists: no lock needed
            ids = torch.randint(0, vocab, (rows, length), device=self.device, generator=gen)
            loss_mask = torch.ones_like(ids)
            context = torch.randn(
                rows, length, width, device=self.device, dtype=context_dtype, generator=gen
            )
            anchors, valid = sample_anchors(loss_mask, cfg.num_anchors, cfg.block_size, gen)
            context, teacher = self._split(context)
            with self._autocast():
                out = dflash_forward_loss(
                    self.model, self.embed_tokens, self.lm_head, context, ids, loss_mask,
                    anchors, valid, teacher, cfg.distill,
                )  # fmt: skip
            out.loss.backward()
            self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def state_dicts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.optimizer.state_dict(), self.scheduler.state_dict()

    def load_state_dicts(self, optimizer: dict[str, Any], scheduler: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(scheduler)
        # The saved groups and schedule base carry the old run's lr and weight decay: a run
        # restarted with new ones (restart --set lr=...) must train with those.
        self.scheduler.base_lrs = [self.config.lr for _ in self.scheduler.base_lrs]
        step = self.scheduler.last_epoch
        for group, factor in zip(
            self.optimizer.param_groups, self.scheduler.lr_lambdas, strict=True
        ):
            group["initial_lr"] = self.config.lr
            group["weight_decay"] = self.config.weight_decay
            group["lr"] = self.config.lr * factor(step)
        self._last_lr = float(self.optimizer.param_groups[0]["lr"])


@dataclass(frozen=True)
class IntervalFigures:
    """A decoded log interval, in host numbers (None where no good step happened)."""

    loss: float | None
    grad_norm: float | None
    steps: int
    bad_steps: int
    max_streak: int
    slot_acc: list[float]  # slot j's accuracy
    run_acc: list[float]  # slot j's acceptance, given slots < j right

    @property
    def acc(self) -> float | None:
        return sum(self.slot_acc) / len(self.slot_acc) if self.slot_acc else None

    @property
    def tau(self) -> float | None:
        """The teacher-forced acceptance length of the interval's blocks."""
        from dflash_train.model.dflash_loss import tau_from_slot_acc

        return tau_from_slot_acc(self.run_acc) if self.run_acc else None


def decode_interval(values: list[float], block_size: int) -> IntervalFigures:
    slots = block_size - 1
    good = values[GOOD_STEPS]
    correct, total, run_correct, run_total = (
        values[N_SCALARS + i * slots : N_SCALARS + (i + 1) * slots] for i in range(N_SLOT_SUMS)
    )
    counted = any(t > 0 for t in total)
    return IntervalFigures(
        loss=values[LOSS_SUM] / good if good else None,
        grad_norm=values[GRAD_NORM_SUM] / good if good else None,
        steps=int(values[STEPS]),
        bad_steps=int(values[BAD_STEPS]),
        max_streak=int(values[MAX_STREAK]),
        slot_acc=_ratios(correct, total) if counted else [],
        run_acc=_ratios(run_correct, run_total) if counted else [],
    )


def _ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    return [n / d if d > 0 else 0.0 for n, d in zip(numerators, denominators, strict=True)]
