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
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dflash_train.config.prepare_config import PrepareConfig, PrepareError
from dflash_train.data.chat_tokens import (
    ChatTemplateError,
    TurnBuilder,
    answer_points,
    encode,
    kept_answer,
    render,
)
from dflash_train.data.conversations import Conversation, Message, user_turn
from dflash_train.data.generation import Progress
from dflash_train.data.heldout import (
    HELDOUT_FILE,
    answer_heldout,
    load_heldout,
    prompts_text,
    split_off_heldout,
)
from dflash_train.data.prepare_progress import PrepareProgress
from dflash_train.data.prepare_work import Job, WorkDir, fingerprint, holding, work_dir_of
from dflash_train.data.writer import (
    PREPARE_INFO,
    combined_stats,
    merge_parts,
    token_stats,
    write_dataset,
)

if TYPE_CHECKING:
    from dflash_train.decode.cached_target import CachedTarget
    from dflash_train.stream.writer import StatusWriter
    from dflash_train.targets.frozen_target import Target

log = logging.getLogger(__name__)

__all__ = ["PREPARE_INFO", "PrepareConfig", "PrepareError", "token_stats", "write_dataset"]
SYNTH_PROMPTS = "synth_prompts.jsonl"
HELDOUT_PROMPTS = "heldout_prompts.jsonl"  # in the work dir, answered at the end
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
_REPEATS = re.compile(r"^(?P<spec>.+)\*(?P<k>\d+)$")


@dataclass(frozen=True)
class Sizing:
    """How big a worker's generation batches may be: `rows` at most, and the KV cache of a
    batch within `cache_budget` bytes."""

    rows: int
    cache_budget: int


def resolve_devices(spec: str | None) -> tuple[str, ...]:
    """`--devices` as torch device strings: None is the first GPU when there is one."""
    import torch

    from dflash_train.config.options import OptionError, parse_devices

    if spec is None:
        return ("cuda:0",) if torch.cuda.is_available() else ("cpu",)
    if spec == "all":
        count = torch.cuda.device_count()
        if count == 0:
            raise PrepareError("devices: all asked for every GPU but CUDA sees none")
        return tuple(f"cuda:{i}" for i in range(count))
    try:
        devices = parse_devices(spec)
    except OptionError as exc:
        raise PrepareError(f"devices: {exc}") from None
    gpus = [d for d in devices if d != "cpu"]
    if gpus and not torch.cuda.is_available():
        raise PrepareError(f"devices: {gpus[0]} requested but CUDA is not available")
    missing = [d for d in gpus if int(d.split(":")[1]) >= torch.cuda.device_count()]
    if missing:
        raise PrepareError(
            f"devices: {missing[0]} does not exist ({torch.cuda.device_count()} GPUs)"
        )
    return devices


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


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]
    loss_mask: list[int]
    finished: bool
    prompt_index: int = -1
    turns: int = 1
    turns_truncated: int = 0


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


def _source_files(specs: Sequence[str]) -> list[str]:
    """The input files the specs read (for the resume fingerprint)."""
    from dflash_train.data.conversations import expand_files
    from dflash_train.data.synth import split_openers

    files: list[str] = []
    for raw in specs:
        spec, _ = split_repeats(raw)
        for part in split_openers(spec):
            if part is not None and Path(part).expanduser().exists():
                files += [str(f) for f in expand_files(Path(part).expanduser())]
    return files


def _with_system(conversation: Conversation, system: str | None) -> Conversation:
    if system is None or conversation[0].role == "system":
        return conversation
    return (Message("system", system), *conversation)


def _load_target(config: PrepareConfig, device: str) -> Target:
    import torch

    from dflash_train.targets.frozen_target import load_target

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return load_target(config.target, device, dtype)


def _runner(target: Target) -> CachedTarget | None:
    from dflash_train.decode.cached_target import CachedTarget, supports

    return CachedTarget(target) if supports(target) else None


def _plan(
    config: PrepareConfig,
    work: WorkDir,
    fingerprint_: dict[str, Any],
    loaders: tuple[Any, Any, Any],
    get_target: Any,
) -> dict[str, Any]:
    """Build the conversations (synthesizing where asked), cut the jobs into chunks and
    write them with the plan; returns the plan."""
    from dflash_train.data.synth import SynthError, synthesize_prompts

    parsed, loaded, openers = loaders
    synth_text = ""
    conversations: list[Conversation] = []
    sources: list[Source] = []
    synth_seconds = 0.0
    for (spec, repeats, count), items, opening in zip(parsed, loaded, openers, strict=True):
        if items is None:
            assert count is not None
            target, runner, sizing = get_target()
            if runner is None:
                raise PrepareError(f"prompts {spec}: synthesis needs a self-attention target")
            began = time.monotonic()
            progress = Progress(0, f"synth {count}")
            try:
                prompts = synthesize_prompts(
                    runner,
                    count,
                    seed=config.seed,
                    stop_ids=stop_token_ids(target),
                    batch_size=sizing.rows,
                    on_tokens=progress.add_tokens,
                    openers=opening,
                )
            except SynthError as exc:
                raise PrepareError(str(exc)) from None
            finally:
                progress.close()
            synth_seconds += time.monotonic() - began
            synth_text += "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
            items = [user_turn(p) for p in prompts]
        items = [_with_system(c, config.system) for c in items]
        sources.append(Source(spec, len(conversations), len(items), repeats))
        conversations.extend(items)
    # Held out before the jobs are cut: training never sees them (data/heldout.py).
    heldout, conversations, sources = split_off_heldout(
        config.prompt_specs, conversations, sources, config.heldout, config.seed
    )
    if not conversations:
        raise PrepareError(
            f"heldout: all {len(heldout)} prompts would be held out and none trained on "
            "(pass a smaller --heldout, or --heldout 0)"
        )
    jobs = plan_jobs(conversations, sources, config.samples, config.seed)
    plan = {
        "fingerprint": fingerprint_,
        "prompt_count": len(conversations),
        "heldout": len(heldout),
        "sources": [asdict(s) for s in sources],
        "jobs": len(jobs),
        "passes": max(job.repeat for job in jobs) + 1,
        "synthesize_seconds": round(synth_seconds, 2),
    }
    files = {SYNTH_PROMPTS: synth_text} if synth_text else {}
    if heldout:
        files[HELDOUT_PROMPTS] = prompts_text(heldout)
    work.write_plan(plan, jobs, config.chunk_size, files)
    plan = work.plan()
    assert plan is not None
    return plan


def _check_out(config: PrepareConfig, work: WorkDir, fingerprint_: dict[str, Any]) -> bool:
    """Whether this call resumes an unfinished prepare; raises PrepareError when the out
    dir or an unfinished prepare of other arguments is in the way."""
    plan = work.plan()
    if plan is not None and plan.get("fingerprint") == fingerprint_:
        return True
    if plan is not None and not config.overwrite:
        theirs = plan.get("fingerprint") or {}
        differ = [k for k in fingerprint_ if theirs.get(k) != fingerprint_[k]] or ["format"]
        raise PrepareError(
            f"out: {work.root} holds an unfinished prepare with other {', '.join(differ)} "
            "(run it with its own arguments to finish it, or pass --overwrite to start over)"
        )
    if config.resume:
        raise PrepareError(f"resume: no unfinished prepare for {config.out} (no {work.root})")
    out = config.out
    occupied = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if occupied and not config.overwrite:
        raise PrepareError(f"out: {out} already exists (pass --overwrite to replace)")
    return False


def prepare_dataset(config: PrepareConfig, *, target: Target | None = None) -> dict[str, Any]:
    """Run the whole prepare (or the rest of an interrupted one) and return what was written
    into prepare.json. `target` lets a caller that already holds the loaded model skip a
    second load (one device only). Under --run-dir it holds the run's lock and writes the
    status stream (prepare_run.py)."""
    from dflash_train.data.synth import SynthError
    from dflash_train.targets.frozen_target import resolve_target

    config.validate()
    try:
        resolve_target(config.target)
    except ValueError as exc:
        raise PrepareError(str(exc)) from None
    devices = resolve_devices(config.devices)
    try:
        loaders = _load_sources(config.prompt_specs)
    except SynthError as exc:
        raise PrepareError(str(exc)) from None
    work = WorkDir(work_dir_of(config.out))
    fingerprint_ = fingerprint(config, _source_files(config.prompt_specs))
    resuming = _check_out(config, work, fingerprint_)
    if config.run_dir is not None:
        from dflash_train.data.prepare_run import run_under_control

        return run_under_control(
            config,
            devices,
            lambda w: _prepare(config, devices, work, fingerprint_, resuming, loaders, target, w),
        )
    from dflash_train.data.prepare_run import stoppable

    return stoppable(
        lambda: _prepare(config, devices, work, fingerprint_, resuming, loaders, target, None),
        work.root,
    )


def _prepare(
    config: PrepareConfig,
    devices: tuple[str, ...],
    work: WorkDir,
    fingerprint_: dict[str, Any],
    resuming: bool,
    loaders: tuple[Any, Any, Any],
    target: Target | None,
    writer: StatusWriter | None,
) -> dict[str, Any]:
    from dflash_train.data.prepare_pool import run_pool

    started = time.time()
    loaded: dict[str, Any] = {}

    def get_target() -> tuple[Target, CachedTarget | None, Sizing]:
        if "target" not in loaded:
            began = time.monotonic()
            held = target if target is not None else _load_target(config, devices[0])
            runner = _runner(held)
            share = devices.count(devices[0])
            loaded["target"] = (
                held,
                runner,
                sizing_for(devices[0], config.batch_size, runner, share),
            )
            loaded["load_seconds"] = round(time.monotonic() - began, 2)
        return loaded["target"]

    with holding(work):
        if not resuming:
            work.clear()
        plan = work.plan() if resuming else None
        if plan is None:
            plan = _plan(config, work, fingerprint_, loaders, get_target)
        done_before = work.done_chunks()
        pending = [c for c in range(plan["chunks"]) if c not in done_before]
        jobs_done = sum(info["jobs"] for info in done_before.values())
        answers_total = sum(answers_to_make(work.read_chunk(c), config.responses) for c in pending)
        progress = PrepareProgress(answers_total, plan["jobs"], jobs_done, writer)
        deadline = None if config.max_seconds is None else started + config.max_seconds
        if len(devices) == 1 and pending:
            get_target()  # the load is not generation time
        generate_started = time.monotonic()
        failed: dict[int, str] = {}
        retried: list[int] = []
        try:
            if len(devices) == 1:
                if pending:
                    held, runner, sizing = get_target()
                    sink = progress.worker(0, devices[0], sizing.rows)
                    sink.tally.load_s = loaded["load_seconds"]
                    for chunk in pending:
                        if deadline is not None and time.time() > deadline and progress.tokens:
                            break
                        info = answer_chunk(
                            work, chunk, held, runner, config, sizing, sink, deadline,
                            {"worker": 0, "device": devices[0]},
                        )  # fmt: skip
                        progress.chunk_done(sink.tally, info["stats"]["samples"])
            else:
                loaded.pop("target", None)  # the workers load their own replicas
                outcome = run_pool(work, devices, config, pending, progress, deadline)
                failed, retried = outcome.failed, outcome.retried
                loaded["load_seconds"] = outcome.load_seconds
                # Generation starts when the first replica is loaded.
                generate_started = outcome.first_ready or generate_started
        finally:
            progress.close()
        generated = time.monotonic()
        done = work.done_chunks()
        if failed:
            first = min(failed)
            raise PrepareError(
                f"devices: chunk {first} failed twice ({failed[first]}); {len(done)} of "
                f"{plan['chunks']} chunks are written in {work.root}: run again to retry"
            )
        missing = [c for c in range(plan["chunks"]) if c not in done]
        if missing and deadline is None:
            raise PrepareError(f"devices: chunks {missing[:5]} were not answered (see the log)")
        info = _dataset_info(
            config, plan, done, missing, work, progress, retried, resuming,
            seconds={
                "load": loaded.get("load_seconds", 0.0),
                "synthesize": plan.get("synthesize_seconds", 0.0),
                "generate": round(generated - generate_started, 2),
            },
        )  # fmt: skip
        info["tokenizer"] = _tokenizer_of(config, loaded)
        extra = {}
        synth = work.root / SYNTH_PROMPTS
        if synth.is_file():
            extra[SYNTH_PROMPTS] = synth.read_text(encoding="utf-8")
        held_out = work.root / HELDOUT_PROMPTS
        if held_out.is_file():  # answered last, by the main process's replica
            held, _, sizing = get_target()
            extra[HELDOUT_FILE] = answer_heldout(
                held,
                load_heldout(str(held_out)).prompts,
                max_new_tokens=config.max_new_tokens,
                batch_size=sizing.rows,
                stop_ids=stop_token_ids(held),
            )
        info["heldout"] = plan.get("heldout", 0)
        merge_parts(
            [work.part_dir(c) for c in sorted(done)], config.out, info, config.num_shards, extra
        )
    work.remove()
    stats = info["stats"]
    log.info("wrote %d samples (%d tokens) to %s", stats["samples"], stats["tokens"], config.out)
    return info


def _tokenizer_of(config: PrepareConfig, loaded: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint of the tokenizer that wrote the ids (train checks its data dirs
    share one)."""
    from dflash_train.data.dataset import tokenizer_fingerprint
    from dflash_train.targets.frozen_target import load_tokenizer, resolve_target

    if "target" in loaded:
        return tokenizer_fingerprint(loaded["target"][0].tokenizer)
    return tokenizer_fingerprint(load_tokenizer(resolve_target(config.target)))


def _dataset_info(
    config: PrepareConfig,
    plan: dict[str, Any],
    done: dict[int, dict[str, Any]],
    missing: list[int],
    work: WorkDir,
    progress: PrepareProgress,
    retried: list[int],
    resuming: bool,
    seconds: dict[str, float],
) -> dict[str, Any]:
    parts = [done[c] for c in sorted(done)]
    stats = combined_stats([p["stats"] for p in parts])
    unanswered = sum(p["unanswered"] for p in parts)
    unanswered += sum(len(work.read_chunk(c)) for c in missing)
    passes = plan["passes"]
    repeats_sampled = passes > 1 and config.temperature == 0
    workers: dict[tuple[int, str], dict[str, Any]] = {}
    for part in parts:
        key = (part["worker"], part["device"])
        entry = workers.setdefault(
            key, {"worker": part["worker"], "device": part["device"], "chunks": 0, "samples": 0,
                  "answer_tokens": 0, "seconds": 0.0}
        )  # fmt: skip
        entry["chunks"] += 1
        entry["samples"] += part["stats"]["samples"]
        entry["answer_tokens"] += part["stats"]["answer_tokens"]
        entry["seconds"] = round(entry["seconds"] + part["seconds"], 3)
    for entry in workers.values():
        entry["answer_tokens_per_s"] = round(
            entry["answer_tokens"] / max(entry["seconds"], 1e-9), 1
        )
    if unanswered:
        log.warning(
            "max-seconds %s passed: %d of %d samples unanswered, not written",
            config.max_seconds, unanswered, plan["jobs"],
        )  # fmt: skip
    return {
        "target": config.target,
        "prompts": config.prompts,
        "prompt_count": plan["prompt_count"],
        "sources": plan["sources"],
        "passes": passes,
        # Set when passes after the first sampled although greedy was asked for.
        "repeat_temperature": REPEAT_TEMPERATURE if repeats_sampled else None,
        "config": config.to_record(),
        "stats": stats,
        "seconds": seconds,
        "answer_tokens_per_s": round(progress.tokens / max(seconds["generate"], 1e-9), 1),
        # Samples not written because --max-seconds passed before their turn was answered.
        "unanswered": unanswered,
        "chunks": plan["chunks"],
        # Chunks an earlier, interrupted call had written; chunks answered again after
        # their worker died.
        "resumed_chunks": len(done) - sum(w.chunks for w in progress.workers.values())
        if resuming
        else 0,
        "retried_chunks": retried,
        "workers": sorted(workers.values(), key=lambda w: (w["worker"], w["device"])),
        "created": time.time(),
    }
