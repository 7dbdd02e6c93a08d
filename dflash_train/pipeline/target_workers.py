"""The target side of the pipeline: one forward of the frozen target on a batch, and the
worker thread per target device that feeds the HiddenStatePool on its own CUDA stream."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_train.model.compile_guard import GUARD
from dflash_train.model.compile_watch import watching
from dflash_train.pipeline.pool import HiddenStatePool, PoolClosed

if TYPE_CHECKING:
    import torch

    from dflash_train.data.buckets import Batch
    from dflash_train.pipeline.stage_timers import StageTimers
    from dflash_train.targets.frozen_target import Target


@dataclass(frozen=True)
class HiddenBatch:
    """A batch ready for the drafter: tensors on the drafter device, `context` the target's
    selected hidden states; `ready` is the CUDA event the drafter's stream must wait on."""

    position: int
    bucket: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    context: torch.Tensor
    tokens: int
    ready: Any | None = None

    def wait_ready(self, device: torch.device) -> None:
        """Order the drafter's stream after the producer's copy; mark the tensors as used
        on that stream so the allocator does not recycle them early."""
        if self.ready is None:
            return
        import torch

        stream = torch.cuda.current_stream(device)
        stream.wait_event(self.ready)
        for tensor in (self.input_ids, self.attention_mask, self.loss_mask, self.context):
            tensor.record_stream(stream)


@dataclass(frozen=True)
class LoadedBatch:
    """A collated host batch and where it sits in the epoch's order."""

    position: int
    batch: Batch
    tokens: int


def forward_to_drafter(
    target: Target,
    item: LoadedBatch,
    layer_ids: Sequence[int],
    drafter_device: torch.device,
    timers: StageTimers,
    stream: Any | None = None,
) -> HiddenBatch:
    """Target forward on `target`'s device, then the hand-over copy to the drafter device.
    With `stream` (CUDA) all of it is queued on that stream and an event marks completion."""
    import torch

    device = target.device
    on_cuda = device.type == "cuda"
    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with ctx:
        batch = item.batch.to(device, non_blocking=on_cuda)
        with timers.time("target_fwd", device):
            hidden = _extract(target, batch, layer_ids)
        with timers.time("copy", device):
            # Outside inference mode, so the drafter may keep the context for backward.
            if hidden.device == drafter_device:
                context = hidden.clone()
            else:
                context = hidden.to(drafter_device, non_blocking=on_cuda)
            moved = batch.to(drafter_device, non_blocking=on_cuda)
        ready = None
        if on_cuda or drafter_device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(stream if stream is not None else torch.cuda.current_stream(device))
    return HiddenBatch(
        position=item.position,
        bucket=batch.bucket,
        input_ids=moved.input_ids,
        attention_mask=moved.attention_mask,
        loss_mask=moved.loss_mask,
        context=context,
        tokens=item.tokens,
        ready=ready,
    )


def _extract(target: Target, batch: Batch, layer_ids: Sequence[int]) -> torch.Tensor:
    from dflash_train.targets.frozen_target import extract_context

    with watching("target_layers", "target layers", tuple(batch.input_ids.shape)):
        return extract_context(target, batch.input_ids, batch.attention_mask, list(layer_ids))


# Batch shapes (rows, length, padded) that the target warm-up runs: the first padded one
# compiles a graph specialised to its length, the second a dynamic one; unpadded batches
# (no attention mask reaches the layers) are a second graph family, likewise. Dynamo always
# specialises a size of 1, so a one-row batch (never padded: collate pads to the longest row)
# takes a graph of its own: without it here, the first one of a run compiled in a worker
# thread, 49 s with no step on an H100's fp8 target (session 23), unreported.
WARM_UP_SHAPES = (
    (2, 256, True), (3, 320, True), (2, 256, False), (3, 320, False), (1, 288, False),
)  # fmt: skip


def target_compile_wanted(target: Target, wanted: bool = True) -> bool:
    """Compile the target's decoder layers: on CUDA, unless the run's config says not to
    (`compile_target`, or DFLASH_COMPILE_TARGET=0 through the config loader)."""
    return wanted and target.device.type == "cuda"


def compile_target_layers(
    target: Target, layer_ids: Sequence[int], backend: str = "inductor"
) -> int:
    """torch.compile each decoder layer up to the deepest needed one (the forward stops
    there). Layers of one class share one compiled graph per layer type. Only `forward` is
    compiled, so extract_context's hooks still run eagerly around it. A hybrid's
    linear-attention kernels go behind opaque ops first (targets/kernel_ops.py: traced, they
    made a graph per sequence length that never finished compiling on the H200); a dense
    target is untouched. Returns the layers compiled."""
    import torch

    from dflash_train.model.dynamo_limits import allow_recompiles
    from dflash_train.targets.fp8 import TARGET_INDUCTOR_OPTIONS, is_fp8
    from dflash_train.targets.linear_attention import make_kernels_opaque

    make_kernels_opaque(target.model)
    # Each replica on its own GPU takes graphs of its own (dynamo_limits.py says why).
    allow_recompiles()
    # An fp8 target's kernels tuned as torchao would tune them, for its compile alone.
    options = TARGET_INDUCTOR_OPTIONS if backend == "inductor" and is_fp8(target) else None
    count = 0
    for layer in target.layers[: max(layer_ids) + 1]:
        if "forward" not in vars(layer):
            layer.forward = torch.compile(
                layer.forward, dynamic=True, backend=backend, options=options
            )
            count += 1
    return count


def uncompile_target_layers(target: Target) -> None:
    for layer in target.layers:
        vars(layer).pop("forward", None)


def warm_up_target(
    target: Target,
    layer_ids: Sequence[int],
    shapes: Sequence[tuple[int, int, bool]] = WARM_UP_SHAPES,
) -> float:
    """One forward per shape on made-up tokens, on the calling (main) thread, so a worker
    thread never compiles. Uses no global RNG. Returns the seconds it took."""
    import torch

    from dflash_train.targets.frozen_target import extract_context

    device = target.device
    gen = torch.Generator(device=device).manual_seed(0)
    start = time.perf_counter()
    for rows, length, padded in shapes:
        ids = torch.randint(0, target.vocab_size, (rows, length), device=device, generator=gen)
        mask = torch.ones_like(ids)
        if padded:
            mask[0, length - length // 4 :] = 0
        extract_context(target, ids, mask, list(layer_ids))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


END_OF_EPOCH = None


class TargetWorker(threading.Thread):
    """Takes loaded batches from `inbox` until END_OF_EPOCH, puts HiddenBatches in the pool.
    The last worker to finish an epoch tells the pool to drain."""

    def __init__(
        self,
        name: str,
        target: Target,
        *,
        inbox: queue.Queue[LoadedBatch | None],
        pool: HiddenStatePool[HiddenBatch],
        layer_ids: Sequence[int],
        drafter_device: torch.device,
        timers: StageTimers,
        finished: FinishCounter,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.target = target
        self.inbox = inbox
        self.pool = pool
        self.layer_ids = list(layer_ids)
        self.drafter_device = drafter_device
        self.timers = timers
        self.finished = finished
        self.stream: Any | None = None
        if target.device.type == "cuda":
            import torch

            self.stream = torch.cuda.Stream(device=target.device)

    def run(self) -> None:
        import torch

        try:
            if self.target.device.type == "cuda":
                torch.cuda.set_device(self.target.device)
            while True:
                item = self.inbox.get()
                if item is END_OF_EPOCH:
                    break
                with GUARD.held():  # compile_guard.py: no compile beside other modules
                    hb = forward_to_drafter(
                        self.target,
                        item,
                        self.layer_ids,
                        self.drafter_device,
                        self.timers,
                        self.stream,
                    )
                self.pool.put(hb, bucket=str(hb.bucket))
        except PoolClosed:
            return
        except BaseException as exc:
            traceback.print_exc(file=sys.stderr)
            self.pool.fail(exc)
            return
        self.finished.done(self.pool)


class FinishCounter:
    """Counts workers done with the epoch; the last one switches the pool to draining."""

    def __init__(self, workers: int) -> None:
        self._left = workers
        self._lock = threading.Lock()

    def done(self, pool: HiddenStatePool[Any]) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            pool.finish_epoch()
