"""Speculative decoding's round and greedy decoding's step with every decision on the device.

A round is the target's verify forward over [anchor, drafts], the acceptance (the longest
prefix of drafts equal to the target's argmax), the bonus token, the drafter's next block
and the next round's inputs, all computed where the model runs and written into the round's
own input buffers; the host reads back one small tensor a round (the target's argmax at each
block position and the accepted count: the acceptance read) to keep the output and decide
when to stop. So on CUDA a round is one graph replay and one copy back, where the eager loop
made three host syncs and a few dozen launches around two graphs. Greedy's step is built the
same way (its argmax feeds its next input on the device), so both decoders pay one sync a
forward. Off CUDA the same code runs uncaptured, which is how the CPU tests check it."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from dflash_train.decode.cached_target import CachedTarget, KVCache, capture_graph, static_forward
from dflash_train.decode.draft_cache import CachedDrafter

log = logging.getLogger(__name__)

S = TypeVar("S", bound="_DeviceStep")


class _DeviceStep(ABC):
    """Fixed-shape work over `cache` whose inputs live in device buffers it rewrites itself;
    capture() makes it one CUDA graph, replay() runs it, captured or not."""

    def __init__(self, runner: CachedTarget, cache: KVCache, width: int, rows: int = 0) -> None:
        """`rows` > 0: that many rows, each at its own `start` [rows]; 0: one row, `start`
        0-dim."""
        self.runner, self.cache = runner, cache
        device = runner.device
        self.ids = torch.zeros(max(rows, 1), width, dtype=torch.long, device=device)
        # The column of each row's ids[:, 0].
        self.start = torch.zeros((rows,) if rows else (), dtype=torch.long, device=device)
        self.pad = torch.zeros(max(rows, 1), dtype=torch.long, device=device)
        # Warm-up runs before the capture execute: at the last columns a step may write,
        # which any real query reaches only after rewriting them.
        self._warm_start = cache.capacity - width
        self.graph: torch.cuda.CUDAGraph | None = None

    @abstractmethod
    def _run(self) -> None:
        """The step itself (a greedy step, a speculative round), on the device buffers."""

    def _capturable(self) -> None:
        """What capture_graph calls: twice to warm up (executed), then under capture."""
        on_cuda = self.runner.device.type == "cuda"
        if not (on_cuda and torch.cuda.is_current_stream_capturing()):
            self.start.fill_(self._warm_start)  # each warm-up moves `start` on
        self._run()

    def capture(self) -> None:
        self.graph, _ = capture_graph(self._capturable, self.runner.device)

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.inference_mode():
                self._run()


def build(make: Callable[[], S], graphed: bool) -> S:
    """make()'s step, captured where `graphed`; a failed capture warns and runs uncaptured."""
    step = make()
    if graphed:
        try:
            step.capture()
        except (RuntimeError, torch.cuda.CudaError) as exc:  # fall back, slower
            log.warning("CUDA graph unavailable (%s); running %s eagerly", exc, type(step).__name__)
            step = make()
    return step


class DeviceGreedy(_DeviceStep):
    """One greedy token a replay: the forward of `ids` [1, 1] at `start`, whose argmax
    becomes the next `ids` while `start` moves on; `logits` holds the last forward's."""

    def __init__(self, runner: CachedTarget, cache: KVCache) -> None:
        super().__init__(runner, cache, 1)
        self.logits = torch.zeros(runner.target.vocab_size, device=runner.device)

    def _run(self) -> None:
        out = static_forward(self.runner, self.cache, self.ids, self.start, self.pad)
        logits = out.logits[0, -1]
        self.logits = logits
        self.ids.copy_(logits.argmax().view(1, 1))
        self.start.add_(1)


class DeviceRound(_DeviceStep):
    """One draft-verify round a replay, for every row of `cache` at once (each row a
    sequence at its own column). `ids` [B, size] holds each row's anchor and its drafts at
    `start` [B]; afterwards `result` [B, size + 1] holds the target's argmax at each block
    position (the first `accepted` equal the drafts, the next is the bonus token) and, last,
    the accepted count, while `ids` and `start` hold the next round's blocks. A row whose
    `live` is False (finished, or no prompt) waits at column 0: its round is computed and
    ignored, so a finished row never runs past the cache while the others go on."""

    def __init__(
        self,
        runner: CachedTarget,
        cache: KVCache,
        layer_ids: Sequence[int],
        drafter: CachedDrafter,
    ) -> None:
        size, rows = drafter.block_size, int(cache.keys.shape[1])
        if drafter.cache.batch != rows:
            raise ValueError(f"drafter cache: {drafter.cache.batch} rows, the target's {rows}")
        super().__init__(runner, cache, size, rows)
        self.layer_ids, self.drafter = tuple(layer_ids), drafter
        device = runner.device
        self.result = torch.zeros(rows, size + 1, dtype=torch.long, device=device)
        self.live = torch.ones(rows, dtype=torch.bool, device=device)

    def begin(self, features: torch.Tensor, anchors: torch.Tensor, starts: Sequence[int]) -> None:
        """Each row's prompt features [B, P, k*H] (positions 0..; a shorter prompt's padding
        stays masked until its own features overwrite it) and its first anchor [B] (at
        starts[row], the prompt's length) set up the first round; every row is live."""
        at = torch.tensor(list(starts), dtype=torch.long, device=self.runner.device)
        self.drafter.cache.extend(features, 0)
        drafts = self.drafter.cache.draft(anchors, at)
        self.ids[:, :1].copy_(anchors.view(-1, 1))
        self.ids[:, 1:].copy_(drafts)
        self.start.copy_(at)
        self.live.fill_(True)

    def _run(self) -> None:
        # A finished row's last round may have taken it up to a block past its length
        # limit: it waits at column 0 instead, where its writes stay inside the cache.
        self.start.masked_fill_(~self.live, 0)
        out = static_forward(
            self.runner, self.cache, self.ids, self.start, self.pad, self.layer_ids
        )
        assert out.context is not None
        posterior = out.logits.argmax(dim=-1)  # posterior[:, i]: the token at start+i+1
        drafts = self.ids[:, 1:]
        accepted = (drafts == posterior[:, :-1]).long().cumprod(dim=1).sum(dim=1)  # [B]
        bonus = posterior.gather(1, accepted[:, None])[:, 0]
        anchor_pos = self.start + torch.where(self.live, accepted + 1, 0)
        # The verify's features join the drafter's cache (those past the accepted drafts
        # stay masked and are overwritten next round); the bonus token is the next anchor.
        following = self.drafter.cache.round(out.context, self.start, bonus, anchor_pos)
        self.result[:, :-1].copy_(posterior)
        self.result[:, -1].copy_(accepted)
        self.ids[:, 0].copy_(bonus)
        self.ids[:, 1:].copy_(following)
        self.start.copy_(anchor_pos)
