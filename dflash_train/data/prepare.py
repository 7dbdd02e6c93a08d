"""The target answers the prompts itself; each (prompt, answer) becomes one training sample of
chat-template tokens with a loss mask on the answer, written atomically as an Arrow dataset
(columns input_ids, loss_mask, and prompt_index into the loaded prompt list)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflash_train.targets import Target

log = logging.getLogger(__name__)

PREPARE_INFO = "prepare.json"
# Repeating a prompt greedily would repeat the answer, so passes after the first sample at
# this temperature when the user asked for greedy.
REPEAT_TEMPERATURE = 0.7


class PrepareError(ValueError):
    """A one-line, operator-facing reason prepare cannot run."""


@dataclass(frozen=True)
class PrepareConfig:
    target: str
    prompts: str
    out: Path
    samples: int | None = None
    max_new_tokens: int = 256
    batch_size: int = 16
    temperature: float = 0.0
    seed: int = 0
    device: str = "cpu"
    num_shards: int = 1
    overwrite: bool = False

    def validate(self) -> None:
        checks = [
            ("samples", self.samples is None or self.samples >= 1, "must be at least 1"),
            ("max-new-tokens", self.max_new_tokens >= 1, "must be at least 1"),
            ("batch-size", self.batch_size >= 1, "must be at least 1"),
            ("temperature", self.temperature >= 0, "must not be negative"),
            ("num-shards", self.num_shards >= 1, "must be at least 1"),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise PrepareError(f"{name}: {getattr(self, name.replace('-', '_'))} {reason}")
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


@dataclass(frozen=True)
class Job:
    """One sample to generate: which prompt, and in which pass over the prompts."""

    index: int
    prompt_index: int
    prompt: str
    prompt_ids: list[int]
    repeat: int


def chat_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The user turn rendered with the target's chat template, ending where the assistant's
    answer begins."""
    if not getattr(tokenizer, "chat_template", None):
        raise PrepareError("target: its tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


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


def generate_batch(
    target: Target,
    jobs: Sequence[Job],
    *,
    max_new_tokens: int,
    temperature: float,
    pad_id: int,
    stops: list[int],
) -> list[Sample]:
    """Left-padded batched generation with an explicit attention mask: without it, a model
    whose pad id equals its eos id (SmolLM2) would mask the prompt's own end-of-turn tokens."""
    import torch
    from transformers import GenerationConfig

    width = max(len(job.prompt_ids) for job in jobs)
    ids = torch.full((len(jobs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(jobs), width), dtype=torch.long)
    for row, job in enumerate(jobs):
        ids[row, width - len(job.prompt_ids) :] = torch.tensor(job.prompt_ids)
        mask[row, width - len(job.prompt_ids) :] = 1
    sampling = temperature > 0
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_k=0 if sampling else None,
        top_p=1.0 if sampling else None,
        pad_token_id=pad_id,
        eos_token_id=stops,
    )
    device = target.device
    with torch.inference_mode():
        out = target.model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
        )
    generated = out[:, width:].cpu().tolist()
    stop_set = set(stops)
    return [
        replace(build_sample(job.prompt_ids, gen, stop_set), prompt_index=job.prompt_index)
        for job, gen in zip(jobs, generated, strict=True)
    ]


def plan_jobs(tokenizer: Any, prompts: Sequence[str], samples: int, seed: int) -> list[Job]:
    """Prompts are visited in one seeded random order, cycled as often as `samples` needs,
    so asking for fewer samples than prompts still gives a mix of every kind of prompt."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(prompts)).tolist()
    rendered: dict[int, list[int]] = {}
    jobs = []
    for i in range(samples):
        p = order[i % len(prompts)]
        if p not in rendered:
            rendered[p] = chat_prompt_ids(tokenizer, prompts[p])
        jobs.append(Job(i, p, prompts[p], rendered[p], i // len(prompts)))
    return jobs


def run_jobs(
    target: Target,
    jobs: Sequence[Job],
    config: PrepareConfig,
    on_batch: Callable[[int], None],
) -> list[Sample]:
    """Generate every job, passes in order, each pass seeded by (seed, pass). Within a pass,
    prompts of similar length share a batch so little of it is padding."""
    import torch

    pad_id = target.tokenizer.pad_token_id
    stops = stop_token_ids(target)
    pad_id = stops[0] if pad_id is None else int(pad_id)
    results: dict[int, Sample] = {}
    for repeat in sorted({job.repeat for job in jobs}):
        torch.manual_seed(config.seed * 1_000_003 + repeat)
        temperature = config.temperature
        if repeat > 0 and temperature == 0:
            temperature = REPEAT_TEMPERATURE
        pass_jobs = sorted(
            (j for j in jobs if j.repeat == repeat), key=lambda j: -len(j.prompt_ids)
        )
        for start in range(0, len(pass_jobs), config.batch_size):
            batch = pass_jobs[start : start + config.batch_size]
            samples = generate_batch(
                target,
                batch,
                max_new_tokens=config.max_new_tokens,
                temperature=temperature,
                pad_id=pad_id,
                stops=stops,
            )
            results.update((job.index, s) for job, s in zip(batch, samples, strict=True))
            on_batch(len(batch))
    return [results[job.index] for job in jobs]


def token_stats(samples: Sequence[Sample]) -> dict[str, Any]:
    lengths = [len(s.input_ids) for s in samples]
    answers = [sum(s.loss_mask) for s in samples]
    return {
        "samples": len(samples),
        "finished": sum(s.finished for s in samples),
        "truncated": sum(not s.finished for s in samples),
        "tokens": sum(lengths),
        "answer_tokens": sum(answers),
        "min_length": min(lengths),
        "max_length": max(lengths),
        "mean_length": round(sum(lengths) / len(lengths), 2),
        "mean_answer_tokens": round(sum(answers) / len(answers), 2),
    }


def write_dataset(samples: Sequence[Sample], out: Path, info: dict[str, Any], shards: int) -> None:
    """Save to a temp dir beside `out`, then rename: a reader never sees half a dataset, and
    an existing `out` (only replaced with --overwrite) survives any failure before the swap."""
    import datasets

    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int32")),
            "loss_mask": datasets.List(datasets.Value("int8")),
            "prompt_index": datasets.Value("int32"),
        }
    )
    table = datasets.Dataset.from_dict(
        {
            "input_ids": [s.input_ids for s in samples],
            "loss_mask": [s.loss_mask for s in samples],
            "prompt_index": [s.prompt_index for s in samples],
        },
        features=features,
    )
    out = out.absolute()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        # datasets' own progress bar would interleave with ours on stderr.
        quiet = datasets.utils.are_progress_bars_disabled()
        datasets.utils.disable_progress_bars()
        try:
            table.save_to_disk(str(tmp), num_shards=min(shards, len(samples)))
        finally:
            if not quiet:
                datasets.utils.enable_progress_bars()
        (tmp / PREPARE_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare_dataset(config: PrepareConfig, *, target: Target | None = None) -> dict[str, Any]:
    """Run the whole prepare and return what was written into prepare.json. `target` lets a
    caller that already holds the loaded model skip a second load."""
    import torch
    from tqdm import tqdm

    from dflash_train.data.prompts import load_prompts
    from dflash_train.targets import load_target, resolve_target

    config.validate()
    try:
        resolve_target(config.target)
    except ValueError as exc:
        raise PrepareError(str(exc)) from None
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise PrepareError(f"device: {config.device} requested but CUDA is not available")
    prompts = load_prompts(config.prompts, "train")
    samples = config.samples or len(prompts)
    started = time.monotonic()
    if target is None:
        dtype = torch.bfloat16 if config.device.startswith("cuda") else torch.float32
        target = load_target(config.target, config.device, dtype)
    loaded = time.monotonic()
    jobs = plan_jobs(target.tokenizer, prompts, samples, config.seed)
    with tqdm(total=samples, desc="prepare", unit="sample", file=sys.stderr) as bar:
        results = run_jobs(target, jobs, config, bar.update)
    generated = time.monotonic()
    stats = token_stats(results)
    passes = (samples + len(prompts) - 1) // len(prompts)
    repeats_sampled = passes > 1 and config.temperature == 0
    info: dict[str, Any] = {
        "target": config.target,
        "prompts": config.prompts,
        "prompt_count": len(prompts),
        "passes": passes,
        # Set when passes after the first sampled although greedy was asked for.
        "repeat_temperature": REPEAT_TEMPERATURE if repeats_sampled else None,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "stats": stats,
        "seconds": {
            "load": round(loaded - started, 2),
            "generate": round(generated - loaded, 2),
        },
        "answer_tokens_per_s": round(stats["answer_tokens"] / max(generated - loaded, 1e-9), 1),
        "created": time.time(),
    }
    write_dataset(results, config.out, info, config.num_shards)
    log.info("wrote %d samples (%d tokens) to %s", stats["samples"], stats["tokens"], config.out)
    return info
