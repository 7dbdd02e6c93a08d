"""An evaluation of a drafter against its target: every prompt decoded greedily and
speculatively at batch 1 and compared. The summary says tau, the rounds by length, whether
the outputs are equal (lossless) and the speed-up; for a mismatch, where the output first
diverged and how near greedy's own choice was there."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dflash_train.decode.speculative import (
    Decoder,
    Generation,
    cached_drafter,
    capacity_for,
    greedy_decode,
    speculative_decode,
    with_block_size,
)
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import Target


@dataclass(frozen=True)
class Divergence:
    """Where a speculative output first differs from greedy's, and how close greedy's own
    choice there was: in bfloat16 a verify over a block and a one-token forward round
    differently, so a near-tie (a gap of an ulp or so) can flip without a bug."""

    prompt: int  # index of the prompt
    position: int  # index of the first generated token that differs
    greedy_token: int
    spec_token: int
    top2_gap: float  # greedy's logits there: top-1 minus top-2
    spec_token_gap: float  # greedy's top-1 minus greedy's logit of the speculative token
    ulp: float  # the spacing of the logits' dtype at the top-1 logit


def first_divergence(
    decoder: Decoder,
    prompt: int,
    prompt_ids: Sequence[int],
    plain: Generation,
    spec: Generation,
    stop_ids: Sequence[int],
) -> Divergence | None:
    """Greedy decoded again up to the first token where `spec` differs from `plain` (the
    same forwards, so the same logits), read there; None if no token differs."""
    pairs = enumerate(zip(plain.tokens, spec.tokens, strict=False))
    position = next((i for i, (a, b) in pairs if a != b), None)
    if position is None:
        return None
    seen: dict[str, float] = {}

    def watch(index: int, logits: torch.Tensor) -> None:
        if index == position:
            top1, top2 = logits.float().topk(2).values.tolist()
            seen.update(top1=top1, top2=top2, spec=float(logits[spec.tokens[position]]))
            exponent = math.frexp(top1)[1] - 1  # |top1| in [2**exponent, 2**(exponent+1))
            seen["ulp"] = torch.finfo(logits.dtype).eps * 2.0**exponent

    greedy_decode(decoder, prompt_ids, position + 1, stop_ids, on_logits=watch)
    return Divergence(
        prompt=prompt,
        position=position,
        greedy_token=plain.tokens[position],
        spec_token=spec.tokens[position],
        top2_gap=seen["top1"] - seen["top2"],
        spec_token_gap=seen["top1"] - seen["spec"],
        ulp=seen["ulp"],
    )


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
    divergences: tuple[Divergence, ...] = ()  # one per mismatched prompt, where measured
    baseline_generated_tokens: int = 0
    # Rounds by the tokens they made: [k - 1] counts the rounds that made k (k - 1 drafts
    # accepted, then the target's own token), k = 1..block_size. tau is their mean; the
    # shape says where it comes from (round_shares).
    round_lengths: tuple[int, ...] = ()

    @property
    def speedup(self) -> float:
        """Speculative tokens a second over greedy's: greedy's wall time over speculative's
        while both made the same tokens (lossless), and still the fair ratio when a
        bfloat16 near-tie made the outputs (and so their lengths) differ."""
        if not (self.seconds and self.baseline_seconds and self.baseline_generated_tokens):
            return 0.0
        spec_rate = self.generated_tokens / self.seconds
        return spec_rate / (self.baseline_generated_tokens / self.baseline_seconds)


def summarize(
    spec: Sequence[Generation], plain: Sequence[Generation], block_size: int
) -> EvalSummary:
    mismatches = tuple(
        i for i, (s, p) in enumerate(zip(spec, plain, strict=True)) if s.tokens != p.tokens
    )
    blocks = sum(len(s.block_lengths) for s in spec)
    lengths = [0] * max(block_size, *(max(s.block_lengths, default=0) for s in spec), 1)
    for s in spec:
        for made in s.block_lengths:
            lengths[made - 1] += 1
    generated = sum(len(s.tokens) for s in spec)
    baseline_generated = sum(len(p.tokens) for p in plain)
    forwards = sum(s.target_forwards for s in spec)
    baseline_forwards = sum(p.target_forwards for p in plain)
    return EvalSummary(
        prompts=len(spec),
        blocks=blocks,
        tau=sum(sum(s.block_lengths) for s in spec) / blocks if blocks else 0.0,
        tokens_per_target_forward=generated / forwards if forwards else 0.0,
        baseline_tokens_per_target_forward=(
            baseline_generated / baseline_forwards if baseline_forwards else 0.0
        ),
        generated_tokens=generated,
        lossless=not mismatches,
        mismatches=mismatches,
        seconds=sum(s.seconds for s in spec),
        baseline_seconds=sum(p.seconds for p in plain),
        block_size=block_size,
        baseline_generated_tokens=baseline_generated,
        round_lengths=tuple(lengths),
    )


def evaluate_prompts(
    target: Target,
    drafter: DFlashDrafter,
    prompt_token_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    block_sizes: Sequence[int] | None = None,
    static: bool = False,
    greedy: dict[tuple[int, ...], Generation] | None = None,
    graphs: bool | None = None,
    on_prompt: Callable[[str, int, float | None], None] | None = None,
    divergences: bool = True,
) -> EvalSummary | list[EvalSummary]:
    """Decode every prompt greedily and speculatively (batch 1, one after the other, timed)
    and compare. With `block_sizes`, one summary per block size (greedy decoded once).
    `static`: Decoder's, for the CPU (CUDA decides on the device anyway). `greedy`: plain
    decodings kept from an earlier call with the same target (the in-run evaluation's,
    whose target is frozen): a prompt found there is not decoded greedily again.
    `graphs`: Decoder's (False: eager even on CUDA). `on_prompt(phase, prompts done, tau
    so far)` after each prompt: phase "greedy" (tau None), then "block N" per block size
    (`eval`'s progress lines). `divergences`: decode each mismatch greedily again to find
    where it diverged (what `eval` reports; the in-run evaluation, which reports only
    whether it was lossless, leaves them out: up to another greedy decoding a prompt)."""
    sizes = list(block_sizes) if block_sizes else [drafter.config.block_size]
    capacity = capacity_for(prompt_token_ids, max_new_tokens, max(sizes))
    decoder = Decoder(
        target, capacity, drafter.config.target_layer_ids, graphs=graphs, static=static
    )
    # One untimed round first: lazy CUDA/kernel initialisation is not decoding time.
    warm = prompt_token_ids[0]
    greedy_decode(decoder, warm, min(4, max_new_tokens), stop_ids)
    views = {size: with_block_size(drafter, size) for size in sizes}
    runners = {size: cached_drafter(decoder, view) for size, view in views.items()}
    for size, view in views.items():
        warm_len = min(2 * size, max_new_tokens)
        speculative_decode(decoder, view, warm, warm_len, stop_ids, runners[size])
    cache = {} if greedy is None else greedy
    plain = []
    for p in prompt_token_ids:
        key = (max_new_tokens, *p)
        if key not in cache:
            cache[key] = greedy_decode(decoder, p, max_new_tokens, stop_ids)
        plain.append(cache[key])
        if on_prompt is not None:
            on_prompt("greedy", len(plain), None)
    summaries = []
    for size, view in views.items():
        spec: list[Generation] = []
        tokens = blocks = 0
        for p in prompt_token_ids:
            done = speculative_decode(decoder, view, p, max_new_tokens, stop_ids, runners[size])
            spec.append(done)
            if on_prompt is not None:
                tokens += sum(done.block_lengths)
                blocks += len(done.block_lengths)
                on_prompt(f"block {size}", len(spec), tokens / blocks if blocks else None)
        summary = summarize(spec, plain, size)
        # After the timed decodes: greedy again for each mismatch, up to its divergence.
        found = (
            first_divergence(decoder, i, prompt_token_ids[i], plain[i], spec[i], stop_ids)
            for i in (summary.mismatches if divergences else ())
        )
        divergences = tuple(d for d in found if d is not None)
        summaries.append(dataclasses.replace(summary, divergences=divergences))
    return summaries if block_sizes else summaries[0]
