"""The target answers a chunk of prepare's jobs: batches sized to the device's memory,
generation seeded by (seed, chunk, turn, batch) so that any number of workers writes the same
samples, every assistant turn of a conversation in order, then the chunk's part written."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dflash_train.config.prepare_config import PrepareConfig, PrepareError
from dflash_train.data.chat_tokens import ChatTemplateError, TurnBuilder, answer_points, kept_answer
from dflash_train.data.prepare_work import Job, WorkDir
from dflash_train.data.prompt_ids import stop_token_ids
from dflash_train.data.writer import Sample, token_stats

if TYPE_CHECKING:
    from dflash_train.decode.cached_target import CachedTarget
    from dflash_train.targets.frozen_target import Target

# Repeating a prompt greedily would repeat the answer, so passes after the first sample at
# this temperature when the user asked for greedy.
REPEAT_TEMPERATURE = 0.7


# KV-cache bytes one generation batch may take on a CPU, and on a GPU when --batch-size
# is given: long prompts get fewer rows per batch.
CACHE_BUDGET = {"cuda": 24 << 30, "cpu": 2 << 30}


CPU_BATCH = 16


# Without --batch-size, a GPU worker's rows are bounded by this share of the memory free
# after its target loaded (split between workers sharing the GPU), and by GPU_MAX_ROWS.
GPU_MEMORY_SHARE = 0.6


GPU_MAX_ROWS = 2048


@dataclass(frozen=True)
class Sizing:
    """How big a worker's generation batches may be: `rows` at most, and the KV cache of a
    batch within `cache_budget` bytes."""

    rows: int
    cache_budget: int


def sizing_for(
    device: str, batch_size: int | None, runner: CachedTarget | None, share: int = 1
) -> Sizing:
    """A worker's batch bounds: --batch-size when given; else 16 rows on a CPU, and on a GPU
    the rows its free memory holds (the cache budget), split between `share` workers."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if batch_size is not None or kind == "cpu":
        return Sizing(batch_size or CPU_BATCH, CACHE_BUDGET[kind])
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    budget = int(free * GPU_MEMORY_SHARE / max(share, 1))
    return Sizing(GPU_MAX_ROWS, budget)


def _batches(
    prompts: list[list[int]], sizing: Sizing, max_new_tokens: int, runner: CachedTarget | None
):
    """Index lists, longest prompts first, each within the sizing's rows and cache budget."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    per_position = runner.cache_bytes_per_position() if runner is not None else 0
    start = 0
    while start < len(order):
        width = len(prompts[order[start]]) + max_new_tokens
        fit = sizing.cache_budget // max(per_position * width, 1) if per_position else sizing.rows
        rows = max(1, min(sizing.rows, fit))
        yield order[start : start + rows]
        start += rows


def _generate(
    target: Target,
    runner: CachedTarget | None,
    prompts: list[list[int]],
    config: PrepareConfig,
    sizing: Sizing,
    temperatures: list[float],
    seed: int,
    stops: list[int],
    progress: Tally,
    deadline: float | None = None,
) -> list[list[int] | None]:
    """Answers in prompt order; None for the prompts of batches not started because
    `deadline` (time.time()) had passed, once something was answered."""
    import torch

    from dflash_train.data.generation import generate_rows, generate_rows_hf

    stop_set = set(stops)
    answers: list[list[int] | None] = [None for _ in prompts]
    for number, rows in enumerate(_batches(prompts, sizing, config.max_new_tokens, runner)):
        late = deadline is not None and time.time() > deadline
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
        cut = sum(1 for answer in out if not answer or answer[-1] not in stop_set)
        progress.add_answers(len(batch), cut)
    return answers


class Tally(Protocol):
    """Where generation reports progress (prepare_progress.WorkerSink, or a worker's pipe)."""

    @property
    def tokens(self) -> int: ...

    def add_tokens(self, count: int) -> None: ...

    def add_answers(self, count: int, truncated: int = 0) -> None: ...


def chunk_seed(seed: int, rank: int, chunk: int) -> int:
    """Seeds turn `rank` of chunk `chunk`: a function of the chunk, not of the worker that
    answers it, so any number of workers samples the same answers."""
    return seed * 1_013 + rank + chunk * 7_919_993


def run_jobs(
    target: Target,
    runner: CachedTarget | None,
    jobs: Sequence[Job],
    config: PrepareConfig,
    sizing: Sizing,
    progress: Tally,
    deadline: float | None = None,
    chunk: int = 0,
) -> tuple[list[Sample], int]:
    """Make every job's sample, seeded by (seed, chunk, turn, batch). Turn r of every
    conversation is generated together, given its turns < r. Past `deadline` no new batch
    starts; jobs left with a turn unanswered are dropped. Returns the samples and how many
    were."""
    tokenizer = target.tokenizer
    stops = stop_token_ids(target)
    stop_set = set(stops)
    keep = config.responses == "keep"
    kwargs = config.template_kwargs
    builders = {job.index: TurnBuilder(tokenizer, job.conversation, kwargs) for job in jobs}
    if keep:
        for job in jobs:
            builder = builders[job.index]
            builder.points = [p for p in builder.points if p < len(job.conversation)]
            if not builder.points:
                raise PrepareError(
                    f"responses keep: conversation {job.prompt_index + 1} has no assistant turn"
                )
    unanswered: set[int] = set()
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
        for rank in range(max((len(b.points) for b in order), default=0)):
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
            seed = chunk_seed(config.seed, rank, chunk)
            answers = _generate(
                target, runner, prompts, config, sizing, temps, seed, stops, progress, deadline
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


def answers_to_make(jobs: Sequence[Job], responses: str) -> int:
    """Assistant turns the target will write for `jobs` (none when the data's are kept)."""
    if responses == "keep":
        return 0
    return sum(len(answer_points(job.conversation)) for job in jobs)


def answer_chunk(
    work: WorkDir,
    chunk: int,
    target: Target,
    runner: CachedTarget | None,
    config: PrepareConfig,
    sizing: Sizing,
    progress: Tally,
    deadline: float | None,
    worker: dict[str, Any],
) -> dict[str, Any]:
    """Answer one chunk and write its part; returns what the part records."""
    started = time.monotonic()
    jobs = work.read_chunk(chunk)
    samples, unanswered = run_jobs(target, runner, jobs, config, sizing, progress, deadline, chunk)
    info = {
        "chunk": chunk,
        "jobs": len(jobs),
        "unanswered": unanswered,
        "stats": token_stats(samples),
        "seconds": round(time.monotonic() - started, 3),
        **worker,
    }
    work.write_part(chunk, samples, info)
    return info


def load_prepare_target(config: PrepareConfig, device: str) -> Target:
    import torch

    from dflash_train.targets.frozen_target import load_target

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return load_target(config.target, device, dtype)


def cached_runner(target: Target) -> CachedTarget | None:
    from dflash_train.decode.cached_target import CachedTarget, supports

    return CachedTarget(target) if supports(target) else None
