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

    def __init__(self, runner: CachedTarget, cache: KVCache, width: int) -> None:
        self.runner, self.cache = runner, cache
        device = runner.device
        self.ids = torch.zeros(1, width, dtype=torch.long, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)  # column of ids[0, 0]
        self.pad = torch.zeros(1, dtype=torch.long, device=device)
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
    """One draft-verify round a replay. `ids` [1, size] holds the anchor and its drafts at
    `start`; afterwards `result` [size + 1] holds the target's argmax at each block position
    (the first `accepted` equal the drafts, the next is the bonus token) and, last, the
    accepted count, while `ids` and `start` hold the next round's block."""

    def __init__(
        self,
        runner: CachedTarget,
        cache: KVCache,
        layer_ids: Sequence[int],
        drafter: CachedDrafter,
    ) -> None:
        size = drafter.block_size
        super().__init__(runner, cache, size)
        self.layer_ids, self.drafter = tuple(layer_ids), drafter
        self.result = torch.zeros(size + 1, dtype=torch.long, device=runner.device)

    def begin(self, features: torch.Tensor, anchor: torch.Tensor, start: int) -> None:
        """The prompt's features [start, k*H] and its first anchor (at `start`) set up the
        first round."""
        drafts = self.drafter.begin(features, anchor)
        self.ids[0, :1].copy_(anchor)
        self.ids[0, 1:].copy_(drafts)
        self.start.fill_(start)

    def _run(self) -> None:
        out = static_forward(
            self.runner, self.cache, self.ids, self.start, self.pad, self.layer_ids
        )
        assert out.context is not None
        posterior = out.logits[0].argmax(dim=-1)  # posterior[i]: the token at start+i+1
        drafts = self.ids[0, 1:]
        accepted = (drafts == posterior[:-1]).long().cumprod(dim=0).sum()
        bonus = posterior.gather(0, accepted.view(1))
        anchor_pos = self.start + accepted + 1
        # The verify's features join the drafter's cache (those past the accepted drafts
        # stay masked and are overwritten next round); the bonus token is the next anchor.
        following = self.drafter.cache.round(out.context[0], self.start, bonus, anchor_pos)
        self.result[:-1].copy_(posterior)
        self.result[-1:].copy_(accepted.view(1))
        self.ids[0, :1].copy_(bonus)
        self.ids[0, 1:].copy_(following)
        self.start.copy_(anchor_pos)
