"""Batched generation over a preallocated KV cache: left-padded rows, one target forward per
step for the whole batch, greedy or seeded sampling, and finished rows dropped from the
batch as it goes so long answers do not keep short ones' slots busy."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from dflash_train.decode.cached_target import CachedTarget, GraphedStep, StaticStep

if TYPE_CHECKING:
    from dflash_train.targets.frozen_target import Target

log = logging.getLogger(__name__)

# Every COMPACT_EVERY steps the host looks at which rows finished (one sync), and drops
# them once fewer than COMPACT_BELOW of the rows are still generating.
COMPACT_EVERY = 8
COMPACT_BELOW = 0.75
# A captured step attends to the cache columns written so far plus this many (re-captured
# when the answers pass them): early steps do not read the whole cache's width.
LIMIT_STEP = 128


class Progress:
    """tqdm over answers with answer tokens/s in the postfix (ETA comes from the answers)."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="answer", file=sys.stderr, smoothing=0.1)
        self.tokens = 0
        self.started = time.monotonic()
        self.shown = 0.0

    def add_tokens(self, count: int) -> None:
        self.tokens += count
        now = time.monotonic()
        if now - self.shown > 0.5:
            self.shown = now
            rate = self.tokens / max(now - self.started, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens:,} tok, {rate:,.0f} tok/s", refresh=True)

    def close(self) -> None:
        self.add_tokens(0)
        self.bar.close()


def pick_tokens(
    logits: torch.Tensor, temperature: float | torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Argmax at temperature 0; otherwise a sample from softmax(logits / T) drawn with the
    Gumbel-max trick from `generator`, so a seeded run repeats itself exactly. `temperature`
    may be one per row (a tensor [B]; rows at 0 stay greedy)."""
    if not isinstance(temperature, torch.Tensor):
        if temperature <= 0:
            return logits.argmax(dim=-1)
        temperature = torch.full((logits.shape[0],), float(temperature), device=logits.device)
    greedy = logits.argmax(dim=-1)
    if bool((temperature <= 0).all()):
        return greedy
    uniform = torch.rand(
        logits.shape, generator=generator, device=logits.device, dtype=torch.float32
    )
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-20)))
    scaled = logits.float() / temperature.clamp_min(1e-6)[:, None]
    return torch.where(temperature > 0, (scaled + gumbel).argmax(dim=-1), greedy)


@torch.inference_mode()
def generate_rows(
    runner: CachedTarget,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float | Sequence[float] = 0.0,
    generator: torch.Generator | None = None,
    on_tokens: Callable[[int], None] | None = None,
    graphs: bool | None = None,
    static: bool = False,
    limit_step: int = LIMIT_STEP,
) -> list[list[int]]:
    """New tokens of every prompt (one batch), each cut after its first stop token.
    `temperature`: one for all rows or one per row. `on_tokens(n)` hears how many answer
    tokens were produced since its last call. Finished rows are dropped as it goes. On CUDA
    the decode step replays a captured graph over the columns written so far plus
    `limit_step`, captured again when rows are dropped or the answers pass it; elsewhere,
    or if capture fails, it runs eagerly. `static`: the captured steps' shapes without
    the capture (StaticStep), which is how the CPU tests check the graph path's logic."""
    device = runner.device
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = torch.full((batch, width), int(stop_ids[0]), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, pads[row] :] = torch.tensor(list(prompt), dtype=torch.long)
    cache = runner.new_cache(batch, width + max_new_tokens, pads)
    pad = torch.tensor(pads, device=device)
    temps: float | torch.Tensor = (
        float(temperature)
        if isinstance(temperature, (int, float))
        else torch.tensor(list(temperature), dtype=torch.float32, device=device)
    )
    logits = runner.forward(cache, ids.to(device), 0, pad=pad).logits[:, -1]
    fixed = static or (device.type == "cuda" if graphs is None else graphs)
    make = StaticStep if static else GraphedStep
    graph: StaticStep | None = None
    out = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)  # original row of each live row
    stops = torch.tensor(list(stop_ids), device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    produced = torch.zeros((), dtype=torch.long, device=device)
    reported = 0
    for step in range(max_new_tokens):
        token = pick_tokens(logits, temps, generator)
        out[rows, step] = token
        produced += (~done).sum()
        done |= torch.isin(token, stops)
        if step == max_new_tokens - 1:
            break
        if step % COMPACT_EVERY == COMPACT_EVERY - 1:
            alive = (~done).nonzero().squeeze(1)
            count = int(alive.numel())
            if on_tokens is not None:
                total = int(produced)
                on_tokens(total - reported)
                reported = total
            if count == 0:
                break
            if count < COMPACT_BELOW * rows.numel():
                graph = None  # bound to the old cache: made again for the rows left
                cache = cache.keep_rows(alive)
                rows, pad, token, done = rows[alive], pad[alive], token[alive], done[alive]
                if isinstance(temps, torch.Tensor):
                    temps = temps[alive]
        column = width + step
        if fixed and (graph is None or column + 1 > graph.limit):
            graph = None
            try:
                graph = make(runner, cache, 1, (), pad=pad, limit=column + 1 + limit_step)
            except RuntimeError as exc:
                log.warning("CUDA graph capture failed (%s); decoding eagerly", exc)
                fixed = False
        if graph is not None:
            logits = graph(token[:, None], column).logits[:, -1]
        else:
            logits = runner.forward(cache, token[:, None], column, pad=pad).logits[:, -1]
    if on_tokens is not None:
        on_tokens(int(produced) - reported)
    stop_set = {int(s) for s in stop_ids}
    answers = []
    for row in out.cpu().tolist():
        answer = []
        for token in row:
            if token < 0:
                break
            answer.append(token)
            if token in stop_set:
                break
        answers.append(answer)
    return answers


@torch.inference_mode()
def generate_rows_hf(
    target: Target,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
) -> list[list[int]]:
    """The same through HF `generate()`, for targets CachedTarget does not drive (hybrid
    linear-attention models). Left-padded with an explicit attention mask: without it, a
    model whose pad id equals its eos id (SmolLM2) would mask the prompt's own end-of-turn
    tokens. Sampling follows torch's global seed."""
    from transformers import GenerationConfig

    pad_id = int(stop_ids[0])
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt))
        mask[row, width - len(prompt) :] = 1
    sampling = temperature > 0
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_k=0 if sampling else None,
        top_p=1.0 if sampling else None,
        pad_token_id=pad_id,
        eos_token_id=list(stop_ids),
    )
    device = target.device
    out = target.model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
    )
    stops = {int(s) for s in stop_ids}
    answers = []
    for row in out[:, width:].cpu().tolist():
        answer = []
        for token in row:
            answer.append(int(token))
            if token in stops:
                break
        answers.append(answer)
    return answers
