"""Prompt synthesis for users without data (`--prompts synth:N`): the target itself writes
user turns. Its chat template is rendered up to where the user's text begins, the target
samples from there until its end-of-turn token, and distinct prompts are kept until N are
found. Seeded: the same seed, target and device give the same prompts.

`synth:N@SPEC` opens each user turn with the first one to three words of a prompt from SPEC
(`builtin`'s train split, or a prompt file) and lets the target go on from there: left to
itself a small target writes mostly chatty requests, and the openers ("Write a Python",
"A train leaves", "Explain") steer it to the kinds of task a few real prompts show, with
as many distinct prompts as N asks."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dflash_train.data.chat_tokens import encode
from dflash_train.data.generation import generate_rows
from dflash_train.decode.cached_target import CachedTarget

PREFIX = "synth:"
TEMPERATURE = 1.0
MAX_PROMPT_TOKENS = 64
MIN_PROMPT_CHARS = 12
MAX_ROUNDS = 12
_MARK = "\x00dflash-user-text\x00"


class SynthError(ValueError):
    """A one-line reason synthesis cannot run or did not find enough prompts."""


OPENER_WORDS = (1, 2, 3)


def split_openers(spec: str) -> tuple[str, str | None]:
    """`synth:N@SPEC` -> ("synth:N", "SPEC"); any other spec -> (spec, None)."""
    if not spec.startswith(PREFIX) or "@" not in spec:
        return spec, None
    base, _, source = spec.partition("@")
    if not source:
        raise SynthError(f"prompts {spec}: expected synth:N@SPEC with SPEC a prompt source")
    return base, source


def openers_of(prompts: Sequence[str]) -> list[str]:
    """The distinct word sequences a synthesized prompt may open with: the first 1-3 words of
    each prompt."""
    found: dict[str, None] = {}
    for prompt in prompts:
        words = prompt.split()
        for count in OPENER_WORDS:
            if len(words) > count:
                found[" ".join(words[:count])] = None
    return list(found)


def parse_spec(spec: str) -> int | None:
    """N of `synth:N`, or None when `spec` is not a synth spec."""
    if not spec.startswith(PREFIX):
        return None
    text = spec.removeprefix(PREFIX)
    if not text.isdigit() or int(text) < 1:
        raise SynthError(f"prompts {spec}: expected synth:N with N a positive integer")
    return int(text)


def _user_turn_prefix_text(tokenizer: Any) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise SynthError("target: its tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _MARK}], add_generation_prompt=False, tokenize=False
    )
    if _MARK not in text:
        raise SynthError("target: its chat template does not write the user's text verbatim")
    return text[: text.index(_MARK)]


def _key(prompt: str) -> str:
    return re.sub(r"\s+", " ", prompt.strip().lower())


def synthesize_prompts(
    runner: CachedTarget,
    count: int,
    *,
    seed: int,
    stop_ids: Sequence[int],
    batch_size: int,
    on_tokens: Callable[[int], None] | None = None,
    openers: Sequence[str] = (),
) -> list[str]:
    """`count` distinct prompts (whitespace- and case-insensitively), each a finished user
    turn of at least MIN_PROMPT_CHARS characters, in the order they were found. With
    `openers`, each row starts with one of them (drawn with the seed) and the prompt is the
    opener followed by what the target wrote."""
    tokenizer = runner.target.tokenizer
    head = _user_turn_prefix_text(tokenizer)
    # Opener and template prefix are tokenised together, as the template would render them.
    starts = {o: encode(tokenizer, head + o) for o in openers} or {"": encode(tokenizer, head)}
    stops = set(int(s) for s in stop_ids)
    found: dict[str, str] = {}
    for round_index in range(MAX_ROUNDS):
        missing = count - len(found)
        if missing <= 0:
            break
        # Ask for more than missing: some come back duplicated, unfinished or too short.
        asked = max(8, int(missing * 1.3) + 8)
        round_seed = seed * 1_000_003 + 7_919 * round_index + 1
        generator = torch.Generator(device=runner.device)
        generator.manual_seed(round_seed)
        picks = random.Random(round_seed).choices(sorted(starts), k=asked)
        for start in range(0, asked, batch_size):
            chosen = picks[start : start + batch_size]
            made = generate_rows(
                runner,
                [starts[o] for o in chosen],
                max_new_tokens=MAX_PROMPT_TOKENS,
                stop_ids=stop_ids,
                temperature=TEMPERATURE,
                generator=generator,
                on_tokens=on_tokens,
            )
            for opener, tokens in zip(chosen, made, strict=True):
                if not tokens or tokens[-1] not in stops:
                    continue  # cut at the length limit: not a whole prompt
                text = tokenizer.decode(tokens[:-1], skip_special_tokens=True)
                prompt = (opener + text).strip()
                key = _key(prompt)
                if len(prompt) >= MIN_PROMPT_CHARS and key not in found:
                    found[key] = prompt
    prompts = list(found.values())[:count]
    if len(prompts) < count:
        raise SynthError(
            f"prompts synth:{count}: only {len(prompts)} distinct prompts after {MAX_ROUNDS} "
            "rounds of sampling; ask for fewer"
        )
    return prompts
