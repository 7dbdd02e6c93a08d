"""Speculative decoding of several prompts in one round (batch_decode.py, the in-run
evaluation's), on the CPU with the real SmolLM2 target and the committed quality-run
drafter: every row makes the tokens and the accepted blocks that decoding its prompt alone
makes, whatever the other rows do (shorter prompts, an early stop, an empty row, a second
batch), and the summary is the batch-1 evaluation's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_train.checkpoint.export import load_any_drafter
from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
from dflash_train.data.prompts import load_prompts
from dflash_train.decode.batch_decode import BatchSpeculator, capacity_for, evaluate_batched
from dflash_train.decode.evaluation import summarize
from dflash_train.decode.speculative import Decoder, Generation, speculative_decode
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import Target

EXPORT = Path(__file__).resolve().parents[2] / "bench" / "results" / "quality_smollm2" / "export"
NEW_TOKENS = 14  # "Say OK." answers in 13


@pytest.fixture(scope="module")
def drafter() -> DFlashDrafter:
    return load_any_drafter(EXPORT, "cpu", torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(smollm2: Target) -> list[list[int]]:
    """Four prompts of four lengths; the second answers in a few tokens and stops."""
    chosen = {len(chat_prompt_ids(smollm2.tokenizer, "Say OK.")): "Say OK."}
    for text in load_prompts("builtin", "eval"):
        chosen.setdefault(len(chat_prompt_ids(smollm2.tokenizer, text)), text)
    texts = [t for t in chosen.values() if t != "Say OK."][:3]
    texts.insert(1, "Say OK.")
    return [chat_prompt_ids(smollm2.tokenizer, t) for t in texts]


@pytest.fixture(scope="module")
def alone(smollm2: Target, drafter: DFlashDrafter, prompts: list[list[int]]) -> list[Generation]:
    """Each prompt decoded by itself, by the batch-1 eager loop (what `eval` runs)."""
    stops = stop_token_ids(smollm2)
    capacity = capacity_for(prompts, NEW_TOKENS, drafter.config.block_size)
    decoder = Decoder(smollm2, capacity, drafter.config.target_layer_ids)
    return [speculative_decode(decoder, drafter, p, NEW_TOKENS, stops) for p in prompts]


def test_every_row_decodes_what_its_prompt_decodes_alone(
    smollm2: Target, drafter: DFlashDrafter, prompts: list[list[int]], alone: list[Generation]
) -> None:
    stops = stop_token_ids(smollm2)
    assert len({len(p) for p in prompts}) == len(prompts)  # every row at its own column
    short = alone[1]
    assert short.tokens[-1] in stops and len(short.tokens) < NEW_TOKENS  # it stops early
    capacity = capacity_for(prompts, NEW_TOKENS, drafter.config.block_size)
    # Three rows: a batch of three, then one of one with two empty rows.
    speculator = BatchSpeculator(smollm2, drafter, 3, capacity)
    assert speculator.rounds.graph is None  # no CUDA here: the same round, uncaptured
    # What a capture's warm-ups execute (at the cache's last columns) leaves no trace.
    with torch.inference_mode():
        for _ in range(2):
            speculator.rounds._capturable()
    got = speculator.decode(prompts, NEW_TOKENS, stops)
    assert [g.tokens for g in got] == [a.tokens for a in alone]
    assert [g.block_lengths for g in got] == [a.block_lengths for a in alone]
    assert [g.target_forwards for g in got] == [a.target_forwards for a in alone]
    assert max(n for a in alone for n in a.block_lengths) >= 2  # drafts were accepted
    # The same speculator again (the run keeps it): the same answers.
    again = speculator.decode(prompts[::-1], NEW_TOKENS, stops)
    assert [g.tokens for g in again] == [a.tokens for a in alone[::-1]]


def test_the_batched_summary_is_the_batch_one_evaluations(
    smollm2: Target, drafter: DFlashDrafter, prompts: list[list[int]], alone: list[Generation]
) -> None:
    """evaluate_prompts' figures are summarize(batch-1 decodings, greedy's): the batched
    evaluation's must be the same numbers, its greedy baseline decoded once and kept."""
    stops = stop_token_ids(smollm2)
    capacity = capacity_for(prompts, NEW_TOKENS, drafter.config.block_size)
    speculator = BatchSpeculator(smollm2, drafter, len(prompts), capacity)
    greedy: dict[tuple[int, ...], Generation] = {}
    phases: list[str] = []
    got = evaluate_batched(
        speculator, smollm2, prompts, NEW_TOKENS, stops, greedy, lambda p, *_: phases.append(p)
    )
    assert phases == ["greedy"] * len(prompts) and len(greedy) == len(prompts)
    want = summarize(alone, [greedy[(NEW_TOKENS, *p)] for p in prompts], 16)
    assert (got.tau, got.blocks, got.lossless, got.prompts) == (
        want.tau, want.blocks, True, len(prompts),
    )  # fmt: skip
    assert got.generated_tokens == want.generated_tokens and got.block_size == 16
    # A second evaluation (the frozen target's greedy answers kept): no greedy decoding.
    phases.clear()
    again = evaluate_batched(
        speculator, smollm2, prompts, NEW_TOKENS, stops, greedy, lambda p, *_: phases.append(p)
    )
    assert phases == [] and again.tau == got.tau


def test_a_stop_between_rounds_ends_the_decoding(
    smollm2: Target, drafter: DFlashDrafter, prompts: list[list[int]]
) -> None:
    capacity = capacity_for(prompts, NEW_TOKENS, drafter.config.block_size)
    speculator = BatchSpeculator(smollm2, drafter, 2, capacity)
    rounds: list[int] = []

    class Stop(Exception):
        pass

    def between() -> None:
        rounds.append(1)
        if len(rounds) == 3:
            raise Stop

    with pytest.raises(Stop):
        speculator.decode(prompts, NEW_TOKENS, stop_token_ids(smollm2), between)
    assert len(rounds) == 3


def test_what_a_speculator_can_decode_is_checked(
    smollm2: Target, drafter: DFlashDrafter, prompts: list[list[int]]
) -> None:
    size = drafter.config.block_size
    capacity = capacity_for(prompts[:2], NEW_TOKENS, size)
    speculator = BatchSpeculator(smollm2, drafter, 2, capacity)
    assert speculator.fits(drafter, prompts[:2], NEW_TOKENS)
    longest = max(prompts, key=len)
    if len(longest) > max(len(p) for p in prompts[:2]):
        assert not speculator.fits(drafter, [longest], NEW_TOKENS)
    assert not speculator.fits(drafter, prompts[:2], NEW_TOKENS + 1)
    other = load_any_drafter(EXPORT, "cpu", torch.float32).eval()
    assert not speculator.fits(other, prompts[:2], NEW_TOKENS)  # its weights, not ours
    with pytest.raises(ValueError, match="columns needed"):
        speculator.decode(prompts[:2], NEW_TOKENS + 1, stop_token_ids(smollm2))
    with pytest.raises(ValueError, match="rows: 0"):
        BatchSpeculator(smollm2, drafter, 0, capacity)
