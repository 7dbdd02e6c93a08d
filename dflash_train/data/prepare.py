"""The target answers the prompts itself; each conversation becomes one training sample of
chat-template tokens with a loss mask on the assistant turns, written atomically as an Arrow
dataset (columns input_ids, loss_mask, and prompt_index into the loaded prompt list).

Prompts come from the built-in set, a text or JSON Lines file of chat data (see
conversations.py), or `synth:N[@SPEC]` (the target writes them, see synth.py); a spec ending in `*K`
is answered K times (passes after the first sample). Multi-turn: every assistant turn is
regenerated given the conversation so far, or (`responses="keep"`) the data's own turns are
tokenised as they are.

This module runs a prepare: it plans the jobs once (prepare_sources.py), answers the chunks on
one device or a pool of workers (prepare_answers.py, prepare_pool.py), resumes an interrupted
one from its work dir (prepare_work.py) and merges the parts into the data set."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from dflash_train.config.prepare_config import PrepareConfig, PrepareError
from dflash_train.data.conversations import Conversation, user_turn
from dflash_train.data.generation import Progress
from dflash_train.data.heldout import (
    HELDOUT_FILE,
    answer_heldout,
    load_heldout,
    prompts_text,
    split_off_heldout,
)
from dflash_train.data.prepare_answers import (
    REPEAT_TEMPERATURE,
    Sizing,
    answer_chunk,
    answers_to_make,
    cached_runner,
    load_prepare_target,
    sizing_for,
)
from dflash_train.data.prepare_progress import PrepareProgress
from dflash_train.data.prepare_sources import (
    Source,
    load_sources,
    plan_jobs,
    source_files,
    with_system,
)
from dflash_train.data.prepare_work import WorkDir, fingerprint, holding, work_dir_of
from dflash_train.data.prompt_ids import stop_token_ids
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
        items = [with_system(c, config.system) for c in items]
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
        loaders = load_sources(config.prompt_specs)
    except SynthError as exc:
        raise PrepareError(str(exc)) from None
    work = WorkDir(work_dir_of(config.out))
    fingerprint_ = fingerprint(config, source_files(config.prompt_specs))
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


def _warn_idle_devices(
    devices: tuple[str, ...], chunks: int, prompts: int, writer: StatusWriter | None
) -> None:
    """A chunk is one worker's unit of work, and its size decides the samples (a resume
    keeps it), so fewer chunks than devices leave devices with nothing to do: say so, on
    stderr and in the stream, rather than let a box run on part of its GPUs unnoticed."""
    if len(devices) < 2 or chunks >= len(devices):
        return
    idle = len(devices) - chunks
    message = (
        f"devices: {chunks} chunk{'s' if chunks != 1 else ''} of work for {len(devices)} "
        f"devices, so {idle} will have nothing to do; a smaller --chunk-size spreads the "
        f"{prompts} prompts left over more of them"
    )
    log.warning("%s", message)
    if writer is not None:
        writer.write("event", level="warning", code="idle_devices", message=message)


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
            held = target if target is not None else load_prepare_target(config, devices[0])
            runner = cached_runner(held)
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
        deadline = None if config.max_seconds is None else started + config.max_seconds
        _warn_idle_devices(devices, len(pending), plan["jobs"] - jobs_done, writer)
        progress = PrepareProgress(answers_total, plan["jobs"], jobs_done, writer, deadline)
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
