"""The held-out set: prompts training never sees, with the target's own answers, in
`heldout.jsonl` beside a prepared dataset (`prepare --heldout N`). One JSON line a
conversation: `messages` (the conversation up to its last user turn, then the target's
answer as an assistant turn) and, when the answer's tokens are known, `input_ids` and
`loss_mask` (the sample as training would see it, for the teacher-forced figures).

The in-run evaluation and `dflash-train eval --run-dir` read it (or `train --eval-data
DIR|FILE`): a prepared dataset dir (its heldout.jsonl), a .jsonl file of that shape (lines
without input_ids give prompts only) or `builtin` (the built-in eval split, prompts only)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_train.data.conversations import (
    Conversation,
    Message,
    eval_prompt,
    load_conversations,
    parse_record,
)
from dflash_train.data.dir_specs import data_dir_specs, spec_parts
from dflash_train.data.prompts import BUILTIN, PromptError

HELDOUT_FILE = "heldout.jsonl"
# Without --heldout: this share of the prompts, at least 1 and at most HELDOUT_MAX.
HELDOUT_SHARE = 0.02
HELDOUT_MAX = 64


class HeldoutError(ValueError):
    """A one-line reason the held-out set cannot be read."""


@dataclass(frozen=True)
class HeldoutSet:
    source: str
    prompts: tuple[Conversation, ...]  # what speculative decoding starts from
    # (input_ids, loss_mask) per conversation whose answer tokens are known
    rows: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]

    def __len__(self) -> int:
        return len(self.prompts)


def heldout_path(spec: str) -> Path:
    path = Path(spec).expanduser()
    return path / HELDOUT_FILE if path.is_dir() else path


def default_heldout(data_dirs: str | Sequence[str]) -> str:
    """The held-out set of a run given no --eval-data: the heldout.jsonl of the first of its
    data dirs that has one (`DIR*K` names DIR), else where the first one's would be, so that
    the error saying it is missing names it."""
    specs = data_dir_specs(data_dirs)
    paths = [Path(spec_parts(spec)[0]).expanduser() / HELDOUT_FILE for spec in specs]
    return str(next((path for path in paths if path.is_file()), paths[0]))


def load_heldout(spec: str) -> HeldoutSet:
    """Raises HeldoutError naming the file (and line) at fault."""
    if spec == BUILTIN:
        try:
            prompts = load_conversations(BUILTIN, "eval")
        except PromptError as exc:
            raise HeldoutError(str(exc)) from None
        return HeldoutSet(BUILTIN, tuple(prompts), ())
    path = heldout_path(spec)
    if not path.is_file():
        raise HeldoutError(
            f"eval_data: {path} not found (prepare --heldout writes it beside the data)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HeldoutError(f"eval_data: {path}: unreadable ({exc})") from None
    prompts: list[Conversation] = []
    rows: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"eval_data {path}: line {number}"
        try:
            conversation = parse_record(line, where)
        except PromptError as exc:
            raise HeldoutError(str(exc)) from None
        if not conversation:
            continue
        prompts.append(eval_prompt(conversation))
        row = _row(json.loads(line), where)
        if row is not None:
            rows.append(row)
    if not prompts:
        raise HeldoutError(f"eval_data: {path} holds no prompts")
    return HeldoutSet(str(path), tuple(prompts), tuple(rows))


def _row(record: dict[str, Any], where: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    ids, mask = record.get("input_ids"), record.get("loss_mask")
    if ids is None and mask is None:
        return None
    if not (_ints(ids) and _ints(mask)) or len(ids) != len(mask):
        raise HeldoutError(f"{where}: input_ids, loss_mask: expected integer lists of one length")
    return tuple(ids), tuple(mask)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def heldout_count(requested: int | None, prompts: int) -> int:
    """How many prompts to hold out: the request, else 2 % of them, rounded down (none of
    fewer than 50: a small file's every prompt is its data), at most HELDOUT_MAX."""
    if requested is not None:
        return min(requested, prompts)
    return min(HELDOUT_MAX, int(HELDOUT_SHARE * prompts))


def heldout_line(
    conversation: Conversation, input_ids: Sequence[int], loss_mask: Sequence[int], answer: str
) -> str:
    """One line of heldout.jsonl: the prompt, the target's answer and its sample."""
    messages = [*eval_prompt(conversation), Message("assistant", answer)]
    record = {
        "messages": [m.as_dict() for m in messages],
        "input_ids": [int(t) for t in input_ids],
        "loss_mask": [int(m) for m in loss_mask],
    }
    return json.dumps(record, ensure_ascii=False) + "\n"


def select_heldout(conversations: Sequence[Conversation], count: int, seed: int) -> list[int]:
    """Indices of `count` conversations to hold out, a seeded random choice (sorted)."""
    import numpy as np

    if count <= 0:
        return []
    order = np.random.default_rng(seed + 7919).permutation(len(conversations))
    return sorted(int(i) for i in order[:count])


def split_off_heldout(
    specs: Sequence[str],
    conversations: Sequence[Conversation],
    sources: Sequence[Any],
    requested: int | None,
    seed: int,
) -> tuple[list[Conversation], list[Conversation], list[Any]]:
    """What prepare holds out, and the training conversations and sources (prepare's
    Source: start and count into the list) without it. With a `builtin` source, the
    built-in eval split (its first N, at most HELDOUT_MAX by default; none of it is in the
    train split); otherwise N of the loaded conversations, which training then never sees."""
    if BUILTIN in (spec.split("*")[0] for spec in specs):
        split = load_conversations(BUILTIN, "eval")
        return (
            split[: HELDOUT_MAX if requested is None else requested],
            list(conversations),
            list(sources),
        )
    taken = set(select_heldout(conversations, heldout_count(requested, len(conversations)), seed))
    kept: list[Conversation] = []
    kept_sources = []
    for source in sources:
        items = [
            conversations[i]
            for i in range(source.start, source.start + source.count)
            if i not in taken
        ]
        kept_sources.append(dataclasses.replace(source, start=len(kept), count=len(items)))
        kept += items
    return [conversations[i] for i in sorted(taken)], kept, kept_sources


def prompts_text(conversations: Sequence[Conversation]) -> str:
    """The held-out prompts as JSON lines (prepare keeps them in its work dir until the end)."""
    return "".join(
        json.dumps({"messages": [m.as_dict() for m in c]}, ensure_ascii=False) + "\n"
        for c in conversations
    )


def answer_heldout(
    target: Any,
    conversations: Sequence[Conversation],
    *,
    max_new_tokens: int,
    batch_size: int,
    stop_ids: Sequence[int],
) -> str:
    """The target's greedy answer to each held-out conversation, as heldout.jsonl text."""
    from dflash_train.data.chat_tokens import encode, render
    from dflash_train.data.generation import generate_rows, generate_rows_hf
    from dflash_train.decode.cached_target import CachedTarget, supports

    tokenizer = target.tokenizer
    runner = CachedTarget(target) if supports(target) else None
    prompts = [
        encode(tokenizer, render(tokenizer, eval_prompt(c), generation_prompt=True))
        for c in conversations
    ]
    lines = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        if runner is not None:
            answers = generate_rows(runner, batch, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        else:
            answers = generate_rows_hf(
                target, batch, max_new_tokens=max_new_tokens, stop_ids=stop_ids
            )
        for offset, (prompt, answer) in enumerate(zip(batch, answers, strict=True)):
            body = answer[:-1] if answer and answer[-1] in stop_ids else answer
            lines.append(
                heldout_line(
                    conversations[start + offset],
                    [*prompt, *answer],
                    [0] * len(prompt) + [1] * len(answer),
                    tokenizer.decode(body),
                )
            )
    return "".join(lines)


def seen_sample(
    rows_of: Callable[[Sequence[int]], Sequence[tuple[Sequence[int], Sequence[int]]]],
    size: int,
    count: int,
    answer_tokens: int,
    seed: int,
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """`count` training samples (`rows_of(indices)` of a dataset of `size`, picked by `seed`:
    the same at every evaluation of a run), each cut after its first `answer_tokens` answer
    tokens. Teacher-forced on the same footing as the held-out answers, they say how much of
    the drafter's shortfall is generalisation (seen against unseen) and how much it does not
    fit even what it trained on."""
    import random

    picked = sorted(random.Random(seed).sample(range(size), min(count, size)))
    sample = []
    for ids, mask in rows_of(picked):
        answered, end = 0, len(ids)
        for position, flag in enumerate(mask):
            answered += int(flag)
            if answered >= answer_tokens:
                end = position + 1
                break
        sample.append((tuple(int(i) for i in ids[:end]), tuple(int(m) for m in mask[:end])))
    return sample


def answer_length(rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> int:
    """The most answer tokens of one of `rows` (0 without rows)."""
    return max((sum(int(m) for m in mask) for _, mask in rows), default=0)
