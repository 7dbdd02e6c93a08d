"""Speculative decoding of many prompts at once, for the in-run held-out evaluation: up to
`rows` prompts share each draft-verify round, so 16 prompts x 128 tokens take ~128/tau
rounds instead of ~16 x 128/tau one prompt after the other (an untrained drafter's 1,960
rounds were 11 s of every evaluation on an H200, bench/results/eval_cost_h200_2026-12-03).

Each row is its own sequence at its own cache column (no padding: a row's prompt starts at
column 0, and a shorter prompt's unused columns are overwritten before any query of that
row reaches them), so a row's tokens and acceptance are those of decoding it alone; only
the arithmetic is batched (a bfloat16 GEMM over 16 rows may round differently from one
over one row, as the verify of a block already does against a greedy step). The rounds
are one DeviceRound (one CUDA graph on a GPU, kept for the whole run: the drafter's and
target's weights are updated in place, never replaced), and the host reads each round's
acceptance once, as speculative_decode does at batch 1. `dflash-train eval` keeps batch 1:
it times the decoding a user gets, one request at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from dflash_train.decode.cached_target import CachedTarget
from dflash_train.decode.device_round import DeviceRound, build
from dflash_train.decode.draft_cache import CachedDrafter
from dflash_train.decode.evaluation import EvalSummary, summarize
from dflash_train.decode.speculative import (
    Decoder,
    Generation,
    capacity_for,
    cut_tokens,
    greedy_decode,
    with_block_size,
)
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import Target


class BatchSpeculator:
    """`drafter` drafting for `target`, `rows` prompts a round, over caches of `capacity`
    columns. `graphs` (default: on CUDA): each round one CUDA graph replay; else the same
    device-deciding round runs uncaptured (the CPU)."""

    def __init__(
        self,
        target: Target,
        drafter: DFlashDrafter,
        rows: int,
        capacity: int,
        graphs: bool | None = None,
    ) -> None:
        if rows < 1:
            raise ValueError(f"rows: {rows}, must be at least 1")
        self.drafter, self.rows, self.capacity = drafter, rows, capacity
        self.view = with_block_size(drafter, None)
        self.runner = CachedTarget(target)
        self.cache = self.runner.new_cache(rows, capacity)
        self.layer_ids = tuple(drafter.config.target_layer_ids)
        self.feature_size = len(self.layer_ids) * drafter.config.hidden_size
        drafts = CachedDrafter(
            self.view, target.lm_head, target.embed_tokens, capacity, self.feature_size,
            graphs=False, batch=rows,
        )  # fmt: skip
        graphed = self.runner.device.type == "cuda" if graphs is None else graphs
        self.rounds = build(
            lambda: DeviceRound(self.runner, self.cache, self.layer_ids, drafts), graphed
        )

    @property
    def block_size(self) -> int:
        return self.view.config.block_size

    def fits(self, drafter: DFlashDrafter, prompts: Sequence[Sequence[int]], tokens: int) -> bool:
        """Whether this speculator can decode `prompts` for `tokens` with `drafter`."""
        needed = capacity_for(prompts, tokens, self.block_size)
        return drafter is self.drafter and needed <= self.capacity

    @torch.inference_mode()
    def decode(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_ids: Sequence[int],
        between_rounds: Callable[[], None] | None = None,
    ) -> list[Generation]:
        """Each prompt's speculative decoding, `rows` prompts at a time. A Generation's
        `seconds` is its batch's wall time shared equally among the batch's prompts (their
        sum is the wall time). `between_rounds()` runs before every round (the in-run
        evaluation raises there to give way to a stop)."""
        needed = capacity_for(prompts, max_new_tokens, self.block_size)
        if needed > self.capacity:
            raise ValueError(f"cache: {needed} columns needed, capacity {self.capacity}")
        done: list[Generation] = []
        for first in range(0, len(prompts), self.rows):
            batch = prompts[first : first + self.rows]
            done.extend(self._batch(batch, max_new_tokens, set(stop_ids), between_rounds))
        return done

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each prompt's forward into its row of the cache, one at a time (as at batch 1):
        the features [rows, longest, k*H] (zeros past each prompt and in unused rows) and the
        first anchors [rows]."""
        device = self.runner.device
        longest = max(len(p) for p in prompts)
        features = torch.zeros(
            self.rows, longest, self.feature_size, dtype=self.runner.dtype, device=device
        )
        anchors = torch.zeros(self.rows, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            ids = torch.tensor([list(prompt)], device=device)
            out = self.runner.forward(self.cache.row(row), ids, 0, layer_ids=self.layer_ids)
            assert out.context is not None
            features[row, : len(prompt)] = out.context[0]
            anchors[row] = out.logits[0, -1].argmax()
        return features, anchors

    def _batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stops: set[int],
        between_rounds: Callable[[], None] | None,
    ) -> list[Generation]:
        started = time.perf_counter()
        rounds, count = self.rounds, len(prompts)
        features, anchors = self._prefill(prompts)
        starts = [len(p) for p in prompts] + [0] * (self.rows - count)
        rounds.begin(features, anchors, starts)
        tokens = [[int(a)] for a in anchors[:count].tolist()]
        lengths: list[list[int]] = [[] for _ in range(count)]
        live = [len(t) < max_new_tokens and t[-1] not in stops for t in tokens]
        live += [False] * (self.rows - count)  # rows without a prompt never move
        rounds.live.copy_(torch.tensor(live))
        while any(live):
            if between_rounds is not None:
                between_rounds()
            rounds.replay()
            result = rounds.result.tolist()  # the acceptance read, every row at once
            finished = False
            for row in range(count):
                if not live[row]:
                    continue
                *posterior, accepted = result[row]
                new = posterior[: accepted + 1]  # the accepted drafts and the bonus token
                tokens[row].extend(new)
                lengths[row].append(len(new))
                if len(tokens[row]) >= max_new_tokens or any(t in stops for t in new):
                    live[row], finished = False, True
            if finished:
                rounds.live.copy_(torch.tensor(live))
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)
        share = (time.perf_counter() - started) / count
        return [
            Generation(tuple(cut_tokens(t, max_new_tokens, stops)), 1 + len(n), tuple(n), share)
            for t, n in zip(tokens, lengths, strict=True)
        ]


def evaluate_batched(
    speculator: BatchSpeculator,
    target: Target,
    prompt_token_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    greedy: dict[tuple[int, ...], Generation],
    on_prompt: Callable[[str, int, float | None], None] | None = None,
    between_rounds: Callable[[], None] | None = None,
    phases: dict[str, float] | None = None,
) -> EvalSummary:
    """evaluation.evaluate_prompts' summary with the speculative decodings batched: each
    prompt against its plain greedy decoding at batch 1 (taken from `greedy`, the frozen
    target's, or decoded once and kept there). Its seconds are wall time, not the batch-1
    speed a user gets (`dflash-train eval` measures that). `phases` gets the seconds of
    the greedy decodings (0 when all were kept) and of the speculative ones."""
    began = time.monotonic()
    missing = [p for p in prompt_token_ids if (max_new_tokens, *p) not in greedy]
    if missing:
        decoder = Decoder(target, capacity_for(missing, max_new_tokens, 0), ())
        for done, prompt in enumerate(missing, 1):
            greedy[(max_new_tokens, *prompt)] = greedy_decode(
                decoder, prompt, max_new_tokens, stop_ids
            )
            if on_prompt is not None:
                on_prompt("greedy", done, None)
        del decoder  # its cache and graphs: needed again only for a new prompt
    plain = [greedy[(max_new_tokens, *p)] for p in prompt_token_ids]
    decoded = time.monotonic()
    spec = speculator.decode(prompt_token_ids, max_new_tokens, stop_ids, between_rounds)
    if phases is not None:
        phases["greedy"] = decoded - began
        phases["speculative"] = time.monotonic() - decoded
    return summarize(spec, plain, speculator.block_size)
