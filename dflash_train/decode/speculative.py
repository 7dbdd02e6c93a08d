"""Real speculative decoding with a DFlash drafter against the target (greedy), and the
plain greedy loop it must reproduce token for token. Both run the target through
CachedTarget over one preallocated KV cache, so cutting the cache back to the accepted
prefix costs nothing. On CUDA a round (verify, acceptance, the drafter's next block) and a
greedy step are each one captured graph that decides on the device (device_round.py); on
the CPU both loops run eagerly, or with `Decoder(static=True)` through the same
device-deciding code uncaptured."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dflash_train.decode.cached_target import CachedTarget, GraphedStep, StepOutput
from dflash_train.decode.device_round import DeviceGreedy, DeviceRound, build
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


def capacity_for(prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int) -> int:
    """Cache columns a decoding needs: the longest prompt, its answer, one block past it
    (0 for greedy) and the anchor."""
    return max(len(p) for p in prompts) + max_new_tokens + block_size + 1


def cut_tokens(tokens: list[int], max_new_tokens: int, stops: set[int]) -> list[int]:
    """A decoding's tokens up to the length limit and the first stop token (kept)."""
    tokens = tokens[:max_new_tokens]
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


class Decoder:
    """The target over one KV cache of `capacity` columns, reused prompt after prompt
    (columns past the current length are never visible). `graphs` (default: on CUDA):
    greedy steps and speculative rounds decide on the device, each one CUDA graph replay,
    and step() replays a graph for each of `widths`; `static`: the same device-deciding
    steps and rounds without graphs (how the CPU tests check their logic)."""

    def __init__(
        self,
        target: Target,
        capacity: int,
        layer_ids: Sequence[int],
        widths: Sequence[int] = (),
        graphs: bool | None = None,
        static: bool = False,
    ) -> None:
        self.runner = CachedTarget(target)
        self.cache = self.runner.new_cache(1, capacity)
        self.layer_ids = tuple(layer_ids)
        self.graphs: dict[int, GraphedStep] = {}
        self.graphed = self.runner.device.type == "cuda" if graphs is None else graphs
        if self.graphed:
            try:
                for n in sorted(set(widths)):
                    self.graphs[n] = GraphedStep(self.runner, self.cache, n, self.layer_ids)
            except (RuntimeError, torch.cuda.CudaError) as exc:  # fall back, slower
                log.warning("CUDA graphs unavailable (%s); decoding eagerly", exc)
                self.graphs = {}
        self.on_device = self.graphed or static
        self.greedy: DeviceGreedy | None = None
        if self.on_device:
            self.greedy = build(lambda: DeviceGreedy(self.runner, self.cache), self.graphed)

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
    decoder: Decoder,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    on_logits: Callable[[int, torch.Tensor], None] | None = None,
) -> Generation:
    """One token per target forward, one unpadded sequence (so no attention mask, which
    also sidesteps SmolLM2's pad == eos trap of generate()). `on_logits(i, logits)` sees
    the logits [vocab] that made token i, before the next forward."""
    started = time.perf_counter()
    stops = set(stop_ids)
    out = decoder.prefill(prompt_ids)
    forwards = 1
    logits = out.logits[0, -1]
    if on_logits is not None:
        on_logits(0, logits)
    tokens = [int(logits.argmax())]
    position = len(prompt_ids)
    device_step = decoder.greedy
    if device_step is not None:
        device_step.ids.fill_(tokens[-1])
        device_step.start.fill_(position)
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        if device_step is not None:
            device_step.replay()
            logits = device_step.logits
            token = int(device_step.ids)  # the one sync a step
        else:
            ids = torch.tensor([[tokens[-1]]], device=decoder.device)
            logits = decoder.step(ids, position).logits[0, -1]
            token = int(logits.argmax())
        forwards += 1
        position += 1
        if on_logits is not None:
            on_logits(len(tokens), logits)
        tokens.append(token)
    _sync(decoder.device)
    return Generation(tuple(tokens), forwards, seconds=time.perf_counter() - started)


def cached_drafter(decoder: Decoder, drafter: DFlashDrafter) -> CachedDrafter | DeviceRound:
    """The drafter over a cache of its context keys/values sized to `decoder`'s, drafting
    blocks of drafter.config.block_size; where `decoder` decides on the device, inside a
    DeviceRound with the target's verify (one CUDA graph a round where it has graphs)."""
    target = decoder.runner.target
    features = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    drafts = CachedDrafter(
        drafter, target.lm_head, target.embed_tokens, decoder.cache.capacity, features, False
    )
    if not decoder.on_device:
        return drafts
    return build(
        lambda: DeviceRound(decoder.runner, decoder.cache, decoder.layer_ids, drafts),
        decoder.graphed,
    )


@torch.inference_mode()
def speculative_decode(
    decoder: Decoder,
    drafter: DFlashDrafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    drafts_by: CachedDrafter | DeviceRound | None = None,
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
    if isinstance(runner, DeviceRound):
        runner.begin(out.context, anchor, [len(prompt_ids)])
        return _rounds_on_device(runner, int(anchor), max_new_tokens, stops, started)
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
    tokens = cut_tokens(tokens, max_new_tokens, stops)
    return Generation(tuple(tokens), forwards, tuple(lengths), time.perf_counter() - started)


def _rounds_on_device(
    rounds: DeviceRound, anchor: int, max_new_tokens: int, stops: set[int], started: float
) -> Generation:
    """speculative_decode's loop once rounds.begin() has set up the first block: each
    replay leaves the next block on the device, the host reads only what it keeps."""
    tokens = [anchor]
    lengths: list[int] = []
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        rounds.replay()
        *posterior, accepted = rounds.result[0].tolist()  # the acceptance read
        new = posterior[: accepted + 1]  # the accepted drafts equal the target's own tokens
        tokens.extend(new)
        lengths.append(len(new))
        if any(token in stops for token in new):
            break
    _sync(rounds.runner.device)
    tokens = cut_tokens(tokens, max_new_tokens, stops)
    seconds = time.perf_counter() - started
    return Generation(tuple(tokens), 1 + len(lengths), tuple(lengths), seconds)


def _decoder_for(
    target: Target, drafter: DFlashDrafter, prompt_len: int, max_new_tokens: int
) -> Decoder:
    capacity = capacity_for([range(prompt_len)], max_new_tokens, drafter.config.block_size)
    return Decoder(target, capacity, drafter.config.target_layer_ids)


def greedy_generate(
    target: Target, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]
) -> Generation:
    decoder = Decoder(target, capacity_for([prompt_ids], max_new_tokens, 0), ())
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


def round_shares(
    round_lengths: Sequence[int], drafts: Sequence[int] = (1, 2, 4, 8)
) -> dict[int, float]:
    """Of all rounds, the share that accepted at least d drafts, for each d in `drafts` (and
    inside the block): 1 is how often the first draft is right, 8 how often a round runs
    long. A recipe that lifts tau lifts some of these more than others."""
    rounds = sum(round_lengths)
    return {d: sum(round_lengths[d:]) / rounds for d in drafts if rounds and d < len(round_lengths)}


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
