"""Real speculative decoding with a DFlash drafter against the target (greedy), and the
plain greedy loop it must reproduce token for token. Both run the target through
CachedTarget over one preallocated KV cache, so cutting the cache back to the accepted
prefix costs nothing, and on CUDA each fixed-width step replays a captured graph."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dflash_train.decode.cached_target import CachedTarget, GraphedStep, StepOutput
from dflash_train.decode.draft_cache import CachedDrafter
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import ResolvedTarget, Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]  # generated tokens, prompt excluded, stop token included
    target_forwards: int  # prefill included
    # Tokens each draft-verify round produced (accepted drafts + the target's bonus token).
    block_lengths: tuple[int, ...] = ()
    seconds: float = 0.0


def check_compatible(drafter: DFlashDrafter, target: Target | ResolvedTarget) -> None:
    """Raise ValueError naming the first field where the drafter was built for another
    target. A ResolvedTarget suffices, so a mismatch is found before loading the target."""
    c = drafter.config
    pairs = [
        ("hidden_size", c.hidden_size, target.hidden_size),
        ("num_target_layers", c.num_target_layers, target.num_layers),
        ("vocab_size", c.vocab_size, target.vocab_size),
    ]
    for name, mine, theirs in pairs:
        if mine != theirs:
            raise ValueError(f"drafter: {name} is {mine}, the target has {theirs}")


def with_block_size(drafter: DFlashDrafter, block_size: int | None) -> DFlashDrafter:
    """The same drafter (shared weights) drafting blocks of `block_size` tokens: a drafter
    trained on blocks of 16 can draft 8 at a time (its block attention is bidirectional,
    so it only sees fewer mask slots)."""
    size = drafter.config.block_size if block_size is None else block_size
    if not 2 <= size <= drafter.config.block_size:
        raise ValueError(
            f"block_size: {size} outside 2..{drafter.config.block_size} (trained size)"
        )
    view = copy.copy(drafter)
    view.config = dataclasses.replace(drafter.config, block_size=size)
    # One block a round, against a context that grows every round: the dense-mask SDPA
    # path. flex_attention would compile again for every new context length.
    view.attention_backend = "sdpa"
    return view


def _cut(tokens: list[int], max_new_tokens: int, stops: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


class Decoder:
    """The target over one KV cache of `capacity` columns, reused prompt after prompt
    (columns past the current length are never visible)."""

    def __init__(
        self,
        target: Target,
        capacity: int,
        layer_ids: Sequence[int],
        widths: Sequence[int] = (),
        graphs: bool | None = None,
    ) -> None:
        self.runner = CachedTarget(target)
        self.cache = self.runner.new_cache(1, capacity)
        self.layer_ids = tuple(layer_ids)
        self.graphs: dict[int, GraphedStep] = {}
        use = self.runner.device.type == "cuda" if graphs is None else graphs
        if use:
            try:
                for n in sorted(set(widths)):
                    self.graphs[n] = GraphedStep(self.runner, self.cache, n, self.layer_ids)
            except (RuntimeError, torch.cuda.CudaError) as exc:  # fall back, slower
                log.warning("CUDA graphs unavailable (%s); decoding eagerly", exc)
                self.graphs = {}

    @property
    def device(self) -> torch.device:
        return self.runner.device

    def prefill(self, prompt_ids: Sequence[int]) -> StepOutput:
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        return self.runner.forward(self.cache, ids, 0, layer_ids=self.layer_ids)

    def step(self, ids: torch.Tensor, start: int) -> StepOutput:
        """ids [1, n] at columns start..: logits of every position and their features."""
        graph = self.graphs.get(int(ids.shape[1]))
        if graph is not None:
            return graph(ids, start)
        return self.runner.forward(
            self.cache, ids, start, layer_ids=self.layer_ids, all_logits=True
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def greedy_decode(
    decoder: Decoder, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]
) -> Generation:
    """One token per target forward, one unpadded sequence (so no attention mask, which
    also sidesteps SmolLM2's pad == eos trap of generate())."""
    started = time.perf_counter()
    stops = set(stop_ids)
    out = decoder.prefill(prompt_ids)
    forwards = 1
    tokens = [int(out.logits[0, -1].argmax())]
    position = len(prompt_ids)
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        ids = torch.tensor([[tokens[-1]]], device=decoder.device)
        out = decoder.step(ids, position)
        forwards += 1
        position += 1
        tokens.append(int(out.logits[0, -1].argmax()))
    _sync(decoder.device)
    return Generation(tuple(tokens), forwards, seconds=time.perf_counter() - started)


def cached_drafter(decoder: Decoder, drafter: DFlashDrafter) -> CachedDrafter:
    """The drafter over a cache of its context keys/values sized to `decoder`'s, drafting
    blocks of drafter.config.block_size (a CUDA graph per round where the device has them)."""
    target = decoder.runner.target
    features = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    return CachedDrafter(
        drafter,
        target.lm_head,
        target.embed_tokens,
        decoder.cache.capacity,
        features,
        graphs=bool(decoder.graphs),  # as the target's steps: none on CPU or after a fallback
    )


@torch.inference_mode()
def speculative_decode(
    decoder: Decoder,
    drafter: DFlashDrafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    drafts_by: CachedDrafter | None = None,
) -> Generation:
    """Each round: the drafter drafts a block from the target features of every accepted
    position, the target verifies the block in one forward, the longest prefix equal to the
    target's greedy choice is kept plus the target's own next token. `drafts_by`: a
    cached_drafter(decoder, drafter) made once for many prompts (one is made if absent)."""
    started = time.perf_counter()
    runner = drafts_by or cached_drafter(decoder, drafter)
    stops = set(stop_ids)
    out = decoder.prefill(prompt_ids)
    forwards = 1
    assert out.context is not None
    anchor = out.logits[0, -1].argmax().view(1)
    start = len(prompt_ids)  # position of the anchor (the last token produced)
    drafts = runner.begin(out.context[0], anchor)
    tokens = [int(anchor)]
    lengths: list[int] = []
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        block = torch.cat((anchor, drafts))[None]
        out = decoder.step(block, start)
        forwards += 1
        posterior = out.logits[0].argmax(dim=-1)  # posterior[i]: the target's token at start+i+1
        agree = (drafts == posterior[:-1]).int().cumprod(dim=0)
        accepted = int(agree.sum())
        new = [*drafts[:accepted].tolist(), int(posterior[accepted])]
        tokens.extend(new)
        lengths.append(len(new))
        if any(token in stops for token in new) or len(tokens) >= max_new_tokens:
            break
        # The verify's features join the drafter's cache (those past the accepted drafts
        # stay masked and are overwritten next round); the bonus token is the next anchor.
        assert out.context is not None
        anchor = posterior[accepted].view(1)
        drafts = runner.round(out.context[0], start, anchor, start + accepted + 1)
        start += accepted + 1
    _sync(decoder.device)
    tokens = _cut(tokens, max_new_tokens, stops)
    return Generation(tuple(tokens), forwards, tuple(lengths), time.perf_counter() - started)


def _decoder_for(
    target: Target, drafter: DFlashDrafter, prompt_len: int, max_new_tokens: int
) -> Decoder:
    size = drafter.config.block_size
    capacity = prompt_len + max_new_tokens + size + 1
    return Decoder(target, capacity, drafter.config.target_layer_ids, widths=(1, size))


def greedy_generate(
    target: Target, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]
) -> Generation:
    decoder = Decoder(target, len(prompt_ids) + max_new_tokens + 1, (), widths=(1,))
    return greedy_decode(decoder, prompt_ids, max_new_tokens, stop_ids)


def speculative_generate(
    target: Target,
    drafter: DFlashDrafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
) -> Generation:
    decoder = _decoder_for(target, drafter, len(prompt_ids), max_new_tokens)
    view = with_block_size(drafter, None)
    return speculative_decode(decoder, view, prompt_ids, max_new_tokens, stop_ids)


@dataclass(frozen=True)
class EvalSummary:
    prompts: int
    blocks: int
    tau: float  # mean tokens per draft-verify round
    tokens_per_target_forward: float
    baseline_tokens_per_target_forward: float
    generated_tokens: int
    lossless: bool
    mismatches: tuple[int, ...]  # indices of prompts whose output differs from greedy
    seconds: float = 0.0  # speculative decoding, summed over prompts
    baseline_seconds: float = 0.0  # plain greedy decoding, summed over prompts
    block_size: int = 0

    @property
    def speedup(self) -> float:
        return self.baseline_seconds / self.seconds if self.seconds else 0.0


def summarize(
    spec: Sequence[Generation], plain: Sequence[Generation], block_size: int
) -> EvalSummary:
    mismatches = tuple(
        i for i, (s, p) in enumerate(zip(spec, plain, strict=True)) if s.tokens != p.tokens
    )
    blocks = sum(len(s.block_lengths) for s in spec)
    generated = sum(len(s.tokens) for s in spec)
    forwards = sum(s.target_forwards for s in spec)
    baseline_forwards = sum(p.target_forwards for p in plain)
    return EvalSummary(
        prompts=len(spec),
        blocks=blocks,
        tau=sum(sum(s.block_lengths) for s in spec) / blocks if blocks else 0.0,
        tokens_per_target_forward=generated / forwards if forwards else 0.0,
        baseline_tokens_per_target_forward=(
            sum(len(p.tokens) for p in plain) / baseline_forwards if baseline_forwards else 0.0
        ),
        generated_tokens=generated,
        lossless=not mismatches,
        mismatches=mismatches,
        seconds=sum(s.seconds for s in spec),
        baseline_seconds=sum(p.seconds for p in plain),
        block_size=block_size,
    )


def evaluate_prompts(
    target: Target,
    drafter: DFlashDrafter,
    prompt_token_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    block_sizes: Sequence[int] | None = None,
) -> EvalSummary | list[EvalSummary]:
    """Decode every prompt greedily and speculatively (batch 1, one after the other, timed)
    and compare. With `block_sizes`, one summary per block size (greedy decoded once)."""
    sizes = list(block_sizes) if block_sizes else [drafter.config.block_size]
    longest = max(len(p) for p in prompt_token_ids)
    decoder = Decoder(
        target,
        longest + max_new_tokens + max(sizes) + 1,
        drafter.config.target_layer_ids,
        widths=(1, *sizes),
    )
    # One untimed round first: lazy CUDA/kernel initialisation is not decoding time.
    warm = prompt_token_ids[0]
    greedy_decode(decoder, warm, min(4, max_new_tokens), stop_ids)
    views = {size: with_block_size(drafter, size) for size in sizes}
    runners = {size: cached_drafter(decoder, view) for size, view in views.items()}
    for size, view in views.items():
        warm_len = min(2 * size, max_new_tokens)
        speculative_decode(decoder, view, warm, warm_len, stop_ids, runners[size])
    plain = [greedy_decode(decoder, p, max_new_tokens, stop_ids) for p in prompt_token_ids]
    summaries = []
    for size, view in views.items():
        spec = [
            speculative_decode(decoder, view, p, max_new_tokens, stop_ids, runners[size])
            for p in prompt_token_ids
        ]
        summaries.append(summarize(spec, plain, size))
    return summaries if block_sizes else summaries[0]
