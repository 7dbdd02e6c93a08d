"""The target answers the prompts itself; each conversation becomes one training sample of
chat-template tokens with a loss mask on the assistant turns, written atomically as an Arrow
dataset (columns input_ids, loss_mask, and prompt_index into the loaded prompt list).

Prompts come from the built-in set, a text or JSON Lines file of chat data (see
conversations.py), or `synth:N[@SPEC]` (the target writes them, see synth.py); a spec ending in `*K`
is answered K times (passes after the first sample). Multi-turn: every assistant turn is
regenerated given the conversation so far, or (`responses="keep"`) the data's own turns are
tokenised as they are."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_train.data.chat_tokens import (
    ChatTemplateError,
    TurnBuilder,
    encode,
    kept_answer,
    render,
)
from dflash_train.data.conversations import Conversation, user_turn
from dflash_train.data.generation import Progress
from dflash_train.data.writer import PREPARE_INFO, token_stats, write_dataset

if TYPE_CHECKING:
    from dflash_train.decode.cached_target import CachedTarget
    from dflash_train.targets.frozen_target import Target

log = logging.getLogger(__name__)

__all__ = ["PREPARE_INFO", "token_stats", "write_dataset"]  # re-exported for callers
SYNTH_PROMPTS = "synth_prompts.jsonl"
# Repeating a prompt greedily would repeat the answer, so passes after the first sample at
# this temperature when the user asked for greedy.
REPEAT_TEMPERATURE = 0.7
RESPONSES = ("regenerate", "keep")
# KV-cache bytes one generation batch may take: long prompts get fewer rows per batch.
CACHE_BUDGET = {"cuda": 24 << 30, "cpu": 2 << 30}
_REPEATS = re.compile(r"^(?P<spec>.+)\*(?P<k>\d+)$")


class PrepareError(ValueError):
    """A one-line, operator-facing reason prepare cannot run."""


@dataclass(frozen=True)
class PrepareConfig:
    target: str
    prompts: str | tuple[str, ...]
    out: Path
    samples: int | None = None
    max_new_tokens: int = 256
    batch_size: int = 16
    temperature: float = 0.0
    seed: int = 0
    device: str = "cpu"
    num_shards: int = 1
    overwrite: bool = False
    responses: str = "regenerate"
    # Answer no new batch once this many seconds have passed since prepare started (the
    # target's load and prompt synthesis count); what was answered is written.
    max_seconds: float | None = None

    @property
    def prompt_specs(self) -> tuple[str, ...]:
        return (self.prompts,) if isinstance(self.prompts, str) else tuple(self.prompts)

    def validate(self) -> None:
        checks = [
            ("samples", self.samples is None or self.samples >= 1, "must be at least 1"),
            ("max-new-tokens", self.max_new_tokens >= 1, "must be at least 1"),
            ("batch-size", self.batch_size >= 1, "must be at least 1"),
            ("temperature", self.temperature >= 0, "must not be negative"),
            ("num-shards", self.num_shards >= 1, "must be at least 1"),
            ("max-seconds", self.max_seconds is None or self.max_seconds > 0, "must be positive"),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise PrepareError(f"{name}: {getattr(self, name.replace('-', '_'))} {reason}")
        if self.responses not in RESPONSES:
            raise PrepareError(f"responses: {self.responses!r} is not one of {RESPONSES}")
        if not self.prompt_specs:
            raise PrepareError("prompts: none given")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise PrepareError(f"device: {self.device!r} is not cpu or cuda[:N]")
        occupied = self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir()))
        if occupied and not self.overwrite:
            raise PrepareError(f"out: {self.out} already exists (pass --overwrite to replace)")
        parent = self.out.absolute().parent
        if not parent.is_dir():
            raise PrepareError(f"out: parent directory {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise PrepareError(f"out: parent directory {parent} is not writable")


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]
    loss_mask: list[int]
    finished: bool
    prompt_index: int = -1
    turns: int = 1
    turns_truncated: int = 0


@dataclass(frozen=True)
class Job:
    """One sample to make: which conversation, and in which pass over the prompts."""

    index: int
    prompt_index: int
    conversation: Conversation
    repeat: int


@dataclass(frozen=True)
class Source:
    """One --prompts spec: where its conversations sit in the loaded list, how many times
    each is answered."""

    spec: str
    start: int
    count: int
    repeats: int


def chat_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The user turn rendered with the target's chat template, ending where the assistant's
    answer begins."""
    try:
        return encode(tokenizer, render(tokenizer, user_turn(prompt), generation_prompt=True))
    except ChatTemplateError as exc:
        raise PrepareError(str(exc)) from None


def conversation_prompt_ids(tokenizer: Any, conversation: Conversation) -> list[int]:
    try:
        return encode(tokenizer, render(tokenizer, conversation, generation_prompt=True))
    except ChatTemplateError as exc:
        raise PrepareError(str(exc)) from None


def stop_token_ids(target: Target) -> list[int]:
    """End-of-turn ids: the tokenizer's eos plus whatever the model's generation config
    stops on (Qwen3 lists both <|im_end|> and <|endoftext|>)."""
    ids: list[int] = []
    configured = getattr(target.model.generation_config, "eos_token_id", None)
    candidates = [target.tokenizer.eos_token_id]
    candidates += configured if isinstance(configured, list) else [configured]
    for token in candidates:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    if not ids:
        raise PrepareError("target: neither tokenizer nor generation config names an eos token")
    return ids


def build_sample(prompt_ids: Sequence[int], generated: Sequence[int], stops: set[int]) -> Sample:
    """Cut the answer after its first end-of-turn token (kept: the drafter must learn to
    predict the end) and mask everything before the answer."""
    answer: list[int] = []
    finished = False
    for token in generated:
        answer.append(int(token))
        if token in stops:
            finished = True
            break
    return Sample(list(prompt_ids) + answer, [0] * len(prompt_ids) + [1] * len(answer), finished)


def split_repeats(spec: str) -> tuple[str, int]:
    """`builtin*4` -> ("builtin", 4); a spec without the suffix is answered once."""
    match = _REPEATS.match(spec)
    if match is None:
        return spec, 1
    repeats = int(match["k"])
    if repeats < 1:
        raise PrepareError(f"prompts {spec}: *K needs K of at least 1")
    return match["spec"], repeats


def plan_jobs(
    conversations: Sequence[Conversation], sources: Sequence[Source], samples: int | None, seed: int
) -> list[Job]:
    """Without `samples`: every conversation of each source, `repeats` times. With it:
    conversations are visited in one seeded random order, cycled as often as `samples`
    needs, so asking for fewer samples than prompts still gives a mix of every kind."""
    import numpy as np

    if samples is None:
        jobs = []
        for source in sources:
            for repeat in range(source.repeats):
                for p in range(source.start, source.start + source.count):
                    jobs.append(Job(len(jobs), p, conversations[p], repeat))
        return jobs
    order = np.random.default_rng(seed).permutation(len(conversations)).tolist()
    return [
        Job(i, order[i % len(order)], conversations[order[i % len(order)]], i // len(order))
        for i in range(samples)
    ]


def _batches(prompts: list[list[int]], config: PrepareConfig, runner: CachedTarget | None):
    """Index lists, longest prompts first, each within batch_size rows and the cache budget."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    per_position = runner.cache_bytes_per_position() if runner is not None else 0
    budget = CACHE_BUDGET["cuda" if config.device.startswith("cuda") else "cpu"]
    start = 0
    while start < len(order):
        width = len(prompts[order[start]]) + config.max_new_tokens
        fit = budget // max(per_position * width, 1) if per_position else config.batch_size
        rows = max(1, min(config.batch_size, fit))
        yield order[start : start + rows]
        start += rows


def _generate(
    target: Target,
    runner: CachedTarget | None,
    prompts: list[list[int]],
    config: PrepareConfig,
    temperatures: list[float],
    seed: int,
    stops: list[int],
    progress: Progress,
    deadline: float | None = None,
) -> list[list[int] | None]:
    """Answers in prompt order; None for the prompts of batches not started because
    `deadline` (time.monotonic()) had passed, once something was answered."""
    import torch

    from dflash_train.data.generation import generate_rows, generate_rows_hf

    answers: list[list[int] | None] = [None for _ in prompts]
    for number, rows in enumerate(_batches(prompts, config, runner)):
        late = deadline is not None and time.monotonic() > deadline
        if late and (number > 0 or progress.tokens > 0):
            break
        batch = [prompts[i] for i in rows]
        if runner is not None:
            generator = torch.Generator(device=runner.device)
            generator.manual_seed(seed * 1_000_003 + number)
            out = generate_rows(
                runner,
                batch,
                max_new_tokens=config.max_new_tokens,
                stop_ids=stops,
                temperature=[temperatures[i] for i in rows],
                generator=generator,
                on_tokens=progress.add_tokens,
            )
        else:  # generate() takes one temperature a call
            torch.manual_seed(seed * 1_000_003 + number)
            out = [[] for _ in rows]
            for value in sorted({temperatures[i] for i in rows}):
                part = [k for k, i in enumerate(rows) if temperatures[i] == value]
                made = generate_rows_hf(
                    target,
                    [batch[k] for k in part],
                    max_new_tokens=config.max_new_tokens,
                    stop_ids=stops,
                    temperature=value,
                )
                for k, answer in zip(part, made, strict=True):
                    out[k] = answer
            progress.add_tokens(sum(map(len, out)))
        for i, answer in zip(rows, out, strict=True):
            answers[i] = answer
        progress.bar.update(len(batch))
    return answers


def run_jobs(
    target: Target,
    runner: CachedTarget | None,
    jobs: Sequence[Job],
    config: PrepareConfig,
    deadline: float | None = None,
) -> tuple[list[Sample], int]:
    """Make every job's sample, seeded by (seed, turn, batch). Turn r of every conversation
    is generated together, given its turns < r. Past `deadline` no new batch starts; jobs
    left with a turn unanswered are dropped. Returns the samples and how many were."""
    tokenizer = target.tokenizer
    stops = stop_token_ids(target)
    stop_set = set(stops)
    keep = config.responses == "keep"
    builders = {job.index: TurnBuilder(tokenizer, job.conversation) for job in jobs}
    if keep:
        for job in jobs:
            builder = builders[job.index]
            builder.points = [p for p in builder.points if p < len(job.conversation)]
            if not builder.points:
                raise PrepareError(
                    f"responses keep: conversation {job.prompt_index + 1} has no assistant turn"
                )
    total = sum(len(b.points) for b in builders.values())
    unanswered: set[int] = set()
    progress = Progress(0 if keep else total, "prepare")
    try:
        # Turn r of every conversation, of every pass, is generated together: passes only
        # differ in temperature, which is per row, so batches stay full.
        order = [builders[j.index] for j in jobs]
        temperature = {
            j.index: config.temperature
            if j.repeat == 0 or config.temperature > 0
            else REPEAT_TEMPERATURE
            for j in jobs
        }
        for rank in range(max(len(b.points) for b in order)):
            active = [
                (j, b)
                for j, b in zip(jobs, order, strict=True)
                if rank < len(b.points) and j.index not in unanswered
            ]
            if keep:
                for _, b in active:
                    point = b.points[rank]
                    b.prompt_ids(point)
                    b.add_answer(point, *kept_answer(tokenizer, b, point, stops))
                continue
            prompts = [b.prompt_ids(b.points[rank]) for _, b in active]
            temps = [temperature[j.index] for j, _ in active]
            seed = config.seed * 1_013 + rank
            answers = _generate(
                target, runner, prompts, config, temps, seed, stops, progress, deadline
            )
            for (j, b), answer in zip(active, answers, strict=True):
                if answer is None:
                    unanswered.add(j.index)
                    continue
                finished = bool(answer) and answer[-1] in stop_set
                body = answer[:-1] if finished else answer
                stop = tokenizer.decode(answer[-1:]) if finished else ""
                b.add_answer(b.points[rank], answer, tokenizer.decode(body), stop)
    except ChatTemplateError as exc:
        raise PrepareError(str(exc)) from None
    finally:
        progress.close()
    samples = []
    for job in jobs:
        if job.index in unanswered:
            continue
        b = builders[job.index]
        samples.append(
            Sample(
                b.ids,
                b.mask,
                all(b.turns_finished),
                job.prompt_index,
                turns=len(b.turns_finished),
                turns_truncated=b.turns_finished.count(False),
            )
        )
    return samples, len(unanswered)


def _load_sources(
    specs: Sequence[str],
) -> tuple[list[tuple[str, int, int | None]], list[Conversation | None], list[list[str]]]:
    """Parse every spec and load the file/builtin ones now, so a bad file fails before the
    target loads. Returns (spec, repeats, synth count) per source, the loaded lists, and
    the openers of each synth source (empty for the others and for plain synth:N)."""
    from dflash_train.data.conversations import load_conversations
    from dflash_train.data.synth import openers_of, parse_spec, split_openers

    parsed = []
    loaded: list[Any] = []
    openers: list[list[str]] = []
    for raw in specs:
        spec, repeats = split_repeats(raw)
        base, opener_spec = split_openers(spec)
        count = parse_spec(base)
        parsed.append((spec, repeats, count))
        loaded.append(None if count is not None else load_conversations(spec, "train"))
        firsts = []
        if opener_spec is not None:
            for conversation in load_conversations(opener_spec, "train"):
                firsts += [m.content for m in conversation if m.role == "user"][:1]
        openers.append(openers_of(firsts))
    return parsed, loaded, openers


def prepare_dataset(config: PrepareConfig, *, target: Target | None = None) -> dict[str, Any]:
    """Run the whole prepare and return what was written into prepare.json. `target` lets a
    caller that already holds the loaded model skip a second load."""
    import torch

    from dflash_train.data.synth import SynthError, synthesize_prompts
    from dflash_train.decode.cached_target import CachedTarget, supports
    from dflash_train.targets.frozen_target import load_target, resolve_target

    config.validate()
    try:
        resolve_target(config.target)
    except ValueError as exc:
        raise PrepareError(str(exc)) from None
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise PrepareError(f"device: {config.device} requested but CUDA is not available")
    try:
        parsed, loaded, openers = _load_sources(config.prompt_specs)
    except SynthError as exc:
        raise PrepareError(str(exc)) from None
    started = time.monotonic()
    if target is None:
        dtype = torch.bfloat16 if config.device.startswith("cuda") else torch.float32
        target = load_target(config.target, config.device, dtype)
    runner = CachedTarget(target) if supports(target) else None
    loaded_at = time.monotonic()
    extra_files: dict[str, str] = {}
    conversations: list[Conversation] = []
    sources: list[Source] = []
    for (spec, repeats, count), items, opening in zip(parsed, loaded, openers, strict=True):
        if items is None:
            assert count is not None
            if runner is None:
                raise PrepareError(f"prompts {spec}: synthesis needs a self-attention target")
            progress = Progress(0, f"synth {count}")
            try:
                prompts = synthesize_prompts(
                    runner,
                    count,
                    seed=config.seed,
                    stop_ids=stop_token_ids(target),
                    batch_size=config.batch_size,
                    on_tokens=progress.add_tokens,
                    openers=opening,
                )
            except SynthError as exc:
                raise PrepareError(str(exc)) from None
            finally:
                progress.close()
            written = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
            extra_files[SYNTH_PROMPTS] = extra_files.get(SYNTH_PROMPTS, "") + written
            items = [user_turn(p) for p in prompts]
        sources.append(Source(spec, len(conversations), len(items), repeats))
        conversations.extend(items)
    synthesized = time.monotonic()
    jobs = plan_jobs(conversations, sources, config.samples, config.seed)
    deadline = None if config.max_seconds is None else started + config.max_seconds
    results, unanswered = run_jobs(target, runner, jobs, config, deadline)
    generated = time.monotonic()
    stats = token_stats(results)
    passes = max(job.repeat for job in jobs) + 1
    repeats_sampled = passes > 1 and config.temperature == 0
    info: dict[str, Any] = {
        "target": config.target,
        "prompts": config.prompts,
        "prompt_count": len(conversations),
        "sources": [asdict(s) for s in sources],
        "passes": passes,
        # Set when passes after the first sampled although greedy was asked for.
        "repeat_temperature": REPEAT_TEMPERATURE if repeats_sampled else None,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "stats": stats,
        "seconds": {
            "load": round(loaded_at - started, 2),
            "synthesize": round(synthesized - loaded_at, 2),
            "generate": round(generated - synthesized, 2),
        },
        "answer_tokens_per_s": round(
            stats["answer_tokens"] / max(generated - synthesized, 1e-9), 1
        ),
        # Samples not written because --max-seconds passed before their turn was answered.
        "unanswered": unanswered,
        "created": time.time(),
    }
    if unanswered:
        log.warning(
            "max-seconds %s passed: %d of %d samples unanswered, not written",
            config.max_seconds, unanswered, len(jobs),
        )  # fmt: skip
    write_dataset(results, config.out, info, config.num_shards, extra_files)
    log.info("wrote %d samples (%d tokens) to %s", stats["samples"], stats["tokens"], config.out)
    return info
