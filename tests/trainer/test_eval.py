"""Speculative decoding on the real SmolLM2 target: lossless against plain greedy decoding,
with a random drafter (tau about 1) and with a briefly trained one (tokens accepted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from drafter_fixtures import tiny_drafter

from dflash_train import protocol
from dflash_train.checkpoint.export import export_drafter
from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
from dflash_train.data.prompts import load_prompts
from dflash_train.decode.evaluation import evaluate_prompts, summarize
from dflash_train.decode.speculative import (
    check_compatible,
    greedy_generate,
    speculative_generate,
)
from dflash_train.model.dflash_loss import dflash_forward_loss, sample_anchors
from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
from dflash_train.protocol import round_shares
from dflash_train.targets.frozen_target import Target, extract_context


def _random_drafter(target: Target, block_size: int = 4) -> DFlashDrafter:
    torch.manual_seed(0)
    config = drafter_config_for_target(target, num_layers=1, block_size=block_size)
    return DFlashDrafter(config).eval()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _cli(*args: str) -> tuple[int, protocol.Reply]:
    proc = _run(*args)
    reply = protocol.decode_reply(proc.stdout)
    assert isinstance(reply, protocol.Reply), (proc.stdout, proc.stderr[-2000:])
    return proc.returncode, reply


def test_random_drafter_is_lossless_with_tau_about_one(smollm2: Target) -> None:
    prompts = load_prompts("builtin", split="eval")[:2]
    ids = [chat_prompt_ids(smollm2.tokenizer, p) for p in prompts]
    summary = evaluate_prompts(smollm2, _random_drafter(smollm2), ids, 8, stop_token_ids(smollm2))
    assert summary.lossless and summary.mismatches == ()
    assert summary.prompts == 2 and summary.blocks >= 2
    assert 1.0 <= summary.tau < 1.5
    assert summary.baseline_tokens_per_target_forward == 1.0


def test_stop_token_and_length_limits_match_greedy(smollm2: Target) -> None:
    ids = chat_prompt_ids(smollm2.tokenizer, "Say OK.")
    stops = stop_token_ids(smollm2)
    plain = greedy_generate(smollm2, ids, 40, stops)
    assert plain.tokens[-1] in stops and len(plain.tokens) < 40  # it answers and stops
    spec = speculative_generate(smollm2, _random_drafter(smollm2), ids, 40, stops)
    assert spec.tokens == plain.tokens
    short = speculative_generate(smollm2, _random_drafter(smollm2), ids, 2, stops)
    assert short.tokens == plain.tokens[:2]


def _train_on_own_answer(target: Target, prompt_ids: list[int], answer: tuple[int, ...]):
    """A few AdamW steps on the target's own answer: the drafter learns to guess it."""
    sequence = torch.tensor([[*prompt_ids, *answer]])
    loss_mask = torch.zeros_like(sequence)
    loss_mask[0, len(prompt_ids) :] = 1
    drafter = _random_drafter(target)
    drafter.train()
    context = extract_context(
        target, sequence, torch.ones_like(sequence), drafter.config.target_layer_ids
    )
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=5e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        anchors, valid = sample_anchors(loss_mask, 16, drafter.config.block_size, generator)
        out = dflash_forward_loss(
            drafter,
            target.embed_tokens,
            target.lm_head,
            context,
            sequence,
            loss_mask,
            anchors,
            valid,
        )
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    return drafter.eval()


def test_trained_drafter_gets_tokens_accepted_and_stays_lossless(smollm2: Target) -> None:
    ids = chat_prompt_ids(smollm2.tokenizer, "Repeat the word hello twenty times.")
    stops = stop_token_ids(smollm2)
    plain = greedy_generate(smollm2, ids, 32, stops)
    drafter = _train_on_own_answer(smollm2, ids, plain.tokens)
    spec = speculative_generate(smollm2, drafter, ids, 32, stops)
    assert spec.tokens == plain.tokens
    # Drafted tokens were kept (the cache crop and the context growth ran with accepted > 0)
    # and the target needed far fewer forwards.
    assert max(spec.block_lengths) >= 2
    assert sum(spec.block_lengths) / len(spec.block_lengths) > 1.5
    assert spec.target_forwards < 0.7 * plain.target_forwards
    # The summary's rounds by length are this decoding's rounds, and their mean is tau.
    summary = summarize([spec], [plain], 16)
    lengths = summary.round_lengths
    assert len(lengths) == 16 and sum(lengths) == summary.blocks == len(spec.block_lengths)
    assert all(lengths[k - 1] == spec.block_lengths.count(k) for k in range(1, 17))
    assert sum(k * n for k, n in enumerate(lengths, 1)) / sum(lengths) == summary.tau
    shares = round_shares(lengths)
    assert shares[1] == sum(n >= 2 for n in spec.block_lengths) / len(spec.block_lengths) > 0
    assert list(shares) == [1, 2, 4, 8] and shares[1] >= shares[2] >= shares[4] >= shares[8]


def test_drafter_for_another_target_is_refused(smollm2: Target) -> None:
    with pytest.raises(ValueError, match="hidden_size is 32, the target has 576"):
        check_compatible(tiny_drafter(), smollm2)


def test_cli_eval_reports_one_json_line(smollm2: Target, tmp_path: Path) -> None:
    export_drafter(_random_drafter(smollm2), tmp_path / "drafter", dtype="float32")
    proc = _run(
        "eval",
        "--target-model",
        "smollm2",
        "--drafter",
        str(tmp_path / "drafter"),
        "--prompts",
        "builtin",
        "--max-prompts",
        "1",
        "--max-new-tokens",
        "6",
        "--device",
        "cpu",
    )
    code, reply = proc.returncode, protocol.decode_reply(proc.stdout)
    assert isinstance(reply, protocol.Reply), proc.stderr[-2000:]
    assert code == 0 and reply.ok and reply.command == "eval"
    progress = [line for line in proc.stderr.splitlines() if line.startswith("eval ")]
    assert progress[0] == "eval greedy: 1/1  prompts decoded  ETA —", proc.stderr
    assert progress[1].startswith("eval block ") and " 1/1  prompts, tau so far " in progress[1]
    assert reply.data["lossless"] is True and reply.data["dtype"] == "float32"
    assert reply.data["prompts"] == 1 and reply.data["max_new_tokens"] == 6
    assert reply.data["blocks"] >= 1
    assert sum(reply.data["round_lengths"]) == reply.data["blocks"]
    assert reply.data["tau"] >= 1.0 and reply.data["tokens_per_target_forward"] > 0


@pytest.mark.parametrize(
    ("extra", "code_name"),
    [
        (["--drafter", "/no/such/drafter"], "bad_drafter"),
        (["--drafter", "D", "--max-prompts", "0"], "bad_argument"),
        (["--drafter", "D", "--prompts", "/no/such/prompts.txt"], "bad_prompts"),
        (["--drafter", "D", "--target-model", "random:nope"], "bad_target"),
    ],
)
def test_cli_eval_bad_input(extra: list[str], code_name: str, tmp_path: Path) -> None:
    args = ["eval", "--target-model", "smollm2", *extra]
    args = [str(tmp_path) if a == "D" else a for a in args]
    code, reply = _cli(*args)
    assert code == 2 and not reply.ok and reply.error_code == code_name
    assert reply.error and "\n" not in reply.error


def test_cli_eval_refuses_a_drafter_of_another_target(tmp_path: Path) -> None:
    export_drafter(tiny_drafter(), tmp_path / "d", dtype="float32")
    code, reply = _cli(
        "eval", "--target-model", "random:tiny", "--drafter", str(tmp_path / "d"), "--device", "cpu"
    )
    assert code == 2 and reply.error_code == "mismatch"
    assert reply.error == "drafter: hidden_size is 32, the target has 64"


def test_smaller_blocks_and_timings_from_one_greedy_pass(smollm2: Target) -> None:
    """A drafter trained on blocks of 4 drafts 2 at a time too; greedy is decoded once for
    both sizes, and each summary carries the wall time of both decodings."""
    from dflash_train.decode.speculative import with_block_size

    ids = [chat_prompt_ids(smollm2.tokenizer, "Say OK.")]
    drafter = _random_drafter(smollm2)
    summaries = evaluate_prompts(smollm2, drafter, ids, 6, stop_token_ids(smollm2), [4, 2])
    assert isinstance(summaries, list) and [s.block_size for s in summaries] == [4, 2]
    assert all(s.lossless and s.seconds > 0 and s.baseline_seconds > 0 for s in summaries)
    assert summaries[0].baseline_seconds == summaries[1].baseline_seconds
    assert with_block_size(drafter, 2).config.block_size == 2 and drafter.config.block_size == 4
    with pytest.raises(ValueError, match=r"block_size: 8 outside 2\.\.4"):
        with_block_size(drafter, 8)
