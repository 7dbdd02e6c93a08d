"""What `--prompts` names: each spec parsed (`SPEC*K` answered K times, `synth:N[@SPEC]`), its
files loaded before the target is (a bad file fails first), and the jobs cut from the loaded
conversations."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_train.config.prepare_config import PrepareError
from dflash_train.data.conversations import Conversation, Message
from dflash_train.data.prepare_work import Job

_REPEATS = re.compile(r"^(?P<spec>.+)\*(?P<k>\d+)$")


@dataclass(frozen=True)
class Source:
    """One --prompts spec: where its conversations sit in the loaded list, how many times
    each is answered."""

    spec: str
    start: int
    count: int
    repeats: int


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


def load_sources(
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


def source_files(specs: Sequence[str]) -> list[str]:
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


def with_system(conversation: Conversation, system: str | None) -> Conversation:
    if system is None or conversation[0].role == "system":
        return conversation
    return (Message("system", system), *conversation)
