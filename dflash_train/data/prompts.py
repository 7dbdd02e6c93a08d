"""Where prompts come from: the built-in set (with a fixed held-out eval split) or a user's
text file (one prompt per line) or JSON Lines file (a "prompt" field per line)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Literal

BUILTIN = "builtin"
# Every EVAL_EVERY-th built-in prompt is held out for eval, so the eval split spans every
# category of the file instead of being its last section.
EVAL_EVERY = 8

Split = Literal["train", "eval"]


class PromptError(ValueError):
    """A one-line, operator-facing reason the prompts cannot be loaded."""


def builtin_prompts() -> list[str]:
    """Every built-in prompt, in file order (both splits)."""
    text = resources.files("dflash_train.data").joinpath("builtin_prompts.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def load_prompts(spec: str, split: Split = "train") -> list[str]:
    """`builtin` gives that split of the built-in set; a path gives every prompt of the file
    for either split (the user decides what is held out)."""
    if split not in ("train", "eval"):
        raise PromptError(f"split: expected 'train' or 'eval', got {split!r}")
    if spec == BUILTIN:
        everything = builtin_prompts()
        held_out = split == "eval"
        return [p for i, p in enumerate(everything) if ((i + 1) % EVAL_EVERY == 0) == held_out]
    path = Path(spec).expanduser()
    if not path.exists():
        raise PromptError(f"prompts {spec}: no such file (or use 'builtin')")
    if not path.is_file():
        raise PromptError(f"prompts {spec}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptError(f"prompts {spec}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise PromptError(f"prompts {spec}: cannot read: {exc.strerror}") from None
    prompts = _parse_jsonl(spec, text) if path.suffix == ".jsonl" else _parse_lines(text)
    if not prompts:
        raise PromptError(f"prompts {spec}: holds no prompts")
    return prompts


def _parse_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _parse_jsonl(spec: str, text: str) -> list[str]:
    prompts: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"prompts {spec}: line {number}: not JSON ({exc.msg})") from None
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str):
            raise PromptError(f"prompts {spec}: line {number}: no string field 'prompt'")
        if prompt.strip():
            prompts.append(prompt)
    return prompts
