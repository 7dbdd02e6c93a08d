"""The decoders that decide on the device (device_round.py: what CUDA captures as one graph a
round and one a greedy step), run uncaptured on the CPU against the real SmolLM2 target and
the committed quality-run drafter: the same tokens and the same accepted blocks as the eager
loops, the stop and length limits, warm-ups that leave no trace, and the report of where a
speculative output first leaves greedy's."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from dflash_train.checkpoint.export import load_any_drafter
from dflash_train.commands.evaluate import _figures
from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
from dflash_train.data.prompts import load_prompts
from dflash_train.decode.device_round import DeviceRound
from dflash_train.decode.draft_cache import CachedDrafter
from dflash_train.decode.evaluation import evaluate_prompts, first_divergence, summarize
from dflash_train.decode.speculative import (
    Decoder,
    Generation,
    cached_drafter,
    greedy_decode,
    speculative_decode,
)
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import Target, load_target

EXPORT = Path(__file__).resolve().parents[2] / "bench" / "results" / "quality_smollm2" / "export"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def drafter() -> DFlashDrafter:
    return load_any_drafter(EXPORT, "cpu", torch.float32).eval()


@pytest.fixture(scope="module")
def prompt_ids(smollm2: Target) -> list[int]:
    return chat_prompt_ids(smollm2.tokenizer, load_prompts("builtin", "eval")[0])


def _decoder(target: Target, drafter: DFlashDrafter, static: bool) -> Decoder:
    capacity = 200 + NEW_TOKENS + drafter.config.block_size + 1
    return Decoder(target, capacity, drafter.config.target_layer_ids, static=static)


@pytest.fixture(scope="module")
def plain(smollm2: Target, drafter: DFlashDrafter, prompt_ids: list[int]) -> Generation:
    """The eager greedy loop's answer (what the CPU has always decoded)."""
    eager = _decoder(smollm2, drafter, False)
    return greedy_decode(eager, prompt_ids, NEW_TOKENS, stop_token_ids(smollm2))


def test_device_rounds_give_the_eager_loops_tokens_and_blocks_after_warm_ups(
    smollm2: Target, drafter: DFlashDrafter, prompt_ids: list[int], plain: Generation
) -> None:
    """capture_graph runs a step twice before capturing it, and those runs execute: they
    must write only columns that decoding rewrites before it reads them."""
    stops = stop_token_ids(smollm2)
    eager, static = _decoder(smollm2, drafter, False), _decoder(smollm2, drafter, True)
    assert eager.greedy is None and static.greedy is not None and static.greedy.graph is None
    rounds = cached_drafter(static, drafter)
    assert isinstance(rounds, DeviceRound) and rounds.graph is None
    assert isinstance(cached_drafter(eager, drafter), CachedDrafter)
    with torch.inference_mode():
        for step in (static.greedy, rounds, static.greedy, rounds):
            step._capturable()
    last = static.cache.capacity - drafter.config.block_size
    assert last < int(rounds.start) <= static.cache.capacity  # the warm-ups ran at the end
    assert greedy_decode(static, prompt_ids, NEW_TOKENS, stops).tokens == plain.tokens
    want = speculative_decode(eager, drafter, prompt_ids, NEW_TOKENS, stops)
    got = speculative_decode(static, drafter, prompt_ids, NEW_TOKENS, stops, rounds)
    assert got.tokens == plain.tokens == want.tokens
    # The same drafts accepted round by round, and some were (acceptance > 0 ran).
    assert got.block_lengths == want.block_lengths and max(got.block_lengths) >= 2
    assert got.target_forwards == 1 + len(got.block_lengths) == want.target_forwards


def test_device_rounds_stop_at_the_stop_token_and_the_length_limit(
    smollm2: Target, drafter: DFlashDrafter
) -> None:
    stops = stop_token_ids(smollm2)
    ids = chat_prompt_ids(smollm2.tokenizer, "Say OK.")
    static = _decoder(smollm2, drafter, True)
    want = greedy_decode(_decoder(smollm2, drafter, False), ids, 40, stops)
    assert want.tokens[-1] in stops and len(want.tokens) < 40  # it answers and stops
    assert greedy_decode(static, ids, 40, stops).tokens == want.tokens
    assert speculative_decode(static, drafter, ids, 40, stops).tokens == want.tokens
    for limit in (1, 2):
        assert speculative_decode(static, drafter, ids, limit, stops).tokens == want.tokens[:limit]
        assert greedy_decode(static, ids, limit, stops).tokens == want.tokens[:limit]


def test_first_divergence_reads_greedys_logits_where_the_outputs_part(
    smollm2: Target, drafter: DFlashDrafter, prompt_ids: list[int], plain: Generation
) -> None:
    stops = stop_token_ids(smollm2)
    static = _decoder(smollm2, drafter, True)
    ids = prompt_ids
    assert first_divergence(static, 0, ids, plain, plain, stops) is None
    at = 5
    # Greedy's own logits for token `at`, from one eager forward over the prompt and the
    # tokens before it: the runner-up there stands in for a speculative token.
    sequence = torch.tensor([[*ids, *plain.tokens[:at]]])
    cache = static.runner.new_cache(1, sequence.shape[1])
    logits = static.runner.forward(cache, sequence, 0, all_logits=True).logits[0, -1]
    top = logits.topk(2)
    assert int(top.indices[0]) == plain.tokens[at]
    flipped = list(plain.tokens)
    flipped[at] = int(top.indices[1])
    spec = dataclasses.replace(plain, tokens=tuple(flipped))
    found = first_divergence(static, 3, ids, plain, spec, stops)
    assert found is not None
    assert (found.prompt, found.position) == (3, at)
    assert (found.greedy_token, found.spec_token) == (plain.tokens[at], flipped[at])
    gap = float(top.values[0] - top.values[1])
    assert found.top2_gap == pytest.approx(gap, abs=1e-3) and found.top2_gap > 0
    assert found.spec_token_gap == pytest.approx(found.top2_gap)
    # float32's spacing at the top logit: 2**-23 of the power of two below it.
    top1 = float(top.values[0])
    assert 2**-24 * abs(top1) < found.ulp <= 2**-23 * abs(top1)


def test_bfloat16_evaluation_on_the_device_path_reports_each_mismatch(
    model_cache: None, prompt_ids: list[int]
) -> None:
    """In bfloat16 a verify over a block and a one-token step round differently, so an
    output may leave greedy's at a near-tie: each mismatch comes with where and how close."""
    target = load_target("smollm2", "cpu", torch.bfloat16)
    drafter = load_any_drafter(EXPORT, "cpu", torch.bfloat16).eval()
    assert target.embed_tokens.weight.dtype == drafter.fc.weight.dtype == torch.bfloat16
    stops = stop_token_ids(target)
    summary = evaluate_prompts(target, drafter, [prompt_ids], 12, stops, static=True)
    assert not isinstance(summary, list)
    assert summary.prompts == 1 and summary.tau >= 1.0 and summary.blocks >= 2
    assert [d.prompt for d in summary.divergences] == list(summary.mismatches)
    for found in summary.divergences:
        assert found.greedy_token != found.spec_token and 0 <= found.position < 12
        assert 0 <= found.top2_gap <= found.spec_token_gap
        assert math.log2(found.ulp).is_integer()
    figures = _figures(summary)  # what `dflash-train eval` replies for this block size
    assert figures["mismatched_prompts"] == [d["prompt"] for d in figures["divergences"]]


def test_speedup_compares_token_rates_when_the_outputs_differ() -> None:
    """A near-tie can end a speculative answer early: the speed-up is tokens a second over
    greedy's, which is greedy's wall time over speculative's only for equal outputs."""
    greedy = [Generation((1, 2, 3, 4), 4, seconds=4.0), Generation((5, 6), 2, seconds=2.0)]
    spec = [Generation((1, 2), 2, (2,), 1.0), Generation((5, 6), 2, (1, 1), 0.5)]
    summary = summarize(spec, greedy, 4)
    assert (summary.generated_tokens, summary.baseline_generated_tokens) == (4, 6)
    assert summary.mismatches == (0,)
    assert summary.speedup == pytest.approx((4 / 1.5) / (6 / 6.0))
    same = summarize(greedy, greedy, 4)
    assert same.speedup == pytest.approx(1.0)
