"""Real speculative decoding with a DFlash drafter against the target (greedy), and the
plain greedy loop it must reproduce token for token."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dflash_train.drafter import DFlashDrafter
from dflash_train.targets import ResolvedTarget, Target


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]  # generated tokens, prompt excluded, stop token included
    target_forwards: int  # prefill included
    # Tokens each draft-verify round produced (accepted drafts + the target's bonus token).
    block_lengths: tuple[int, ...] = ()


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


def _cut(tokens: list[int], max_new_tokens: int, stops: set[int]) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


def _new_cache(target: Target) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=target.model.config)


def _cache_kwargs(target: Target, cache: Any) -> dict[str, Any]:
    # transformers renamed `past_key_values` to `cache` (5.2x); accept either version.
    name = "cache" if "cache" in inspect.signature(target.model.forward).parameters else None
    return {name or "past_key_values": cache, "use_cache": True}


def _crop(cache: Any, length: int) -> None:
    # A negative count ("drop this many") is the form every transformers 5 release accepts.
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


@torch.inference_mode()
def greedy_generate(
    target: Target, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]
) -> Generation:
    """One token per target forward over a KV cache. No attention mask is needed (one
    unpadded sequence), which also sidesteps SmolLM2's pad == eos trap of generate()."""
    stops = set(stop_ids)
    cache = _new_cache(target)
    ids = torch.tensor([list(prompt_ids)], device=target.device)
    tokens: list[int] = []
    forwards = 0
    while len(tokens) < max_new_tokens:
        out = target.model(input_ids=ids, **_cache_kwargs(target, cache), logits_to_keep=1)
        forwards += 1
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        if token in stops:
            break
        ids = torch.tensor([[token]], device=target.device)
    return Generation(tuple(tokens), forwards)


def _context(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def _draft_block(
    drafter: DFlashDrafter, target: Target, context: torch.Tensor, anchor_token: int
) -> torch.Tensor:
    """Draft tokens for slots 1..bs-1 of the block anchored at position len(context)."""
    device = context.device
    anchors = torch.tensor([[context.shape[1]]], device=device)
    block = drafter.embed_blocks(target.embed_tokens, torch.tensor([[anchor_token]], device=device))
    hidden = drafter(block.to(context.dtype), context, anchors)
    head: nn.Module = target.lm_head
    return head(hidden[0, 1:].to(head.weight.dtype)).argmax(dim=-1)


@torch.inference_mode()
def speculative_generate(
    target: Target,
    drafter: DFlashDrafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
) -> Generation:
    """Each round: the drafter drafts a block from the target features of every accepted
    position, the target verifies the block in one forward, the longest prefix equal to the
    target's greedy choice is kept plus the target's own next token."""
    stops = set(stop_ids)
    layer_ids = drafter.config.target_layer_ids
    cache = _new_cache(target)
    device = target.device
    prompt = torch.tensor([list(prompt_ids)], device=device)
    out = target.model(
        input_ids=prompt,
        **_cache_kwargs(target, cache),
        output_hidden_states=True,
        logits_to_keep=1,
    )
    forwards = 1
    context = _context(out.hidden_states, layer_ids)
    tokens = [int(out.logits[0, -1].argmax())]
    lengths: list[int] = []
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        start = context.shape[1]  # position of the anchor (the last token produced)
        anchor = tokens[-1]
        drafts = _draft_block(drafter, target, context, anchor)
        block = torch.cat((torch.tensor([anchor], device=device), drafts))[None]
        out = target.model(
            input_ids=block, **_cache_kwargs(target, cache), output_hidden_states=True
        )
        forwards += 1
        posterior = out.logits[0].argmax(dim=-1)  # posterior[i]: the target's token at start+i+1
        agree = (drafts == posterior[:-1]).int().cumprod(dim=0)
        accepted = int(agree.sum())
        new = [*drafts[:accepted].tolist(), int(posterior[accepted])]
        tokens.extend(new)
        lengths.append(len(new))
        # Keep cache and features for the anchor and the accepted drafts; the bonus token
        # becomes the next round's anchor and enters the cache then.
        _crop(cache, start + accepted + 1)
        fresh = _context(out.hidden_states, layer_ids)[:, : accepted + 1]
        context = torch.cat((context, fresh), dim=1)
        if any(token in stops for token in new):
            break
    return Generation(tuple(_cut(tokens, max_new_tokens, stops)), forwards, tuple(lengths))


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


def evaluate_prompts(
    target: Target,
    drafter: DFlashDrafter,
    prompt_token_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
) -> EvalSummary:
    blocks = 0
    lengths_total = 0
    generated = 0
    baseline_generated = 0
    forwards = 0
    baseline_forwards = 0
    mismatches: list[int] = []
    for index, prompt in enumerate(prompt_token_ids):
        spec = speculative_generate(target, drafter, prompt, max_new_tokens, stop_ids)
        plain = greedy_generate(target, prompt, max_new_tokens, stop_ids)
        if spec.tokens != plain.tokens:
            mismatches.append(index)
        blocks += len(spec.block_lengths)
        lengths_total += sum(spec.block_lengths)
        generated += len(spec.tokens)
        baseline_generated += len(plain.tokens)
        forwards += spec.target_forwards
        baseline_forwards += plain.target_forwards
    return EvalSummary(
        prompts=len(prompt_token_ids),
        blocks=blocks,
        tau=lengths_total / blocks if blocks else 0.0,
        tokens_per_target_forward=generated / forwards if forwards else 0.0,
        baseline_tokens_per_target_forward=(
            baseline_generated / baseline_forwards if baseline_forwards else 0.0
        ),
        generated_tokens=generated,
        lossless=not mismatches,
        mismatches=tuple(mismatches),
    )
