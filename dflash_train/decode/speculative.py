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
