"""The held-out teacher-forced pass: rows batched into right-padded target forwards and their
blocks sliced through the drafter give the figures of one row and one anchor at a time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_train.checkpoint.export import load_any_drafter
from dflash_train.data.prompt_ids import chat_prompt_ids
from dflash_train.data.prompts import load_prompts
from dflash_train.decode.heldout_figures import anchor_count, teacher_forced
from dflash_train.model.dflash_loss import dflash_forward_loss, every_anchor, tau_from_slot_acc
from dflash_train.targets.frozen_target import Target, extract_context

EXPORT = Path(__file__).resolve().parents[2] / "bench" / "results" / "quality_smollm2" / "export"


@pytest.mark.slow
def test_batched_rows_and_sliced_anchors_score_as_one_row_and_anchor_at_a_time(
    smollm2: Target,
) -> None:
    """The committed quality drafter (real acceptance, not a random drafter's zeros) on the
    real SmolLM2: held-out rows of unlike lengths (prompt, then another prompt's words as
    the answer; one cut by max_length, one with an answer too short for a block) scored in
    batches, a few anchors a pass, equal the same rows scored alone, all anchors at once, and
    tau is the mean leading run of each block scored alone."""
    drafter = load_any_drafter(EXPORT, "cpu", torch.float32).eval()
    tokenizer = smollm2.tokenizer
    prompts = load_prompts("builtin", "eval")[:7]
    rows = []
    for i, prompt in enumerate(prompts):
        ids = chat_prompt_ids(tokenizer, prompt)
        answer = tokenizer.encode(" ".join(prompts[i + 1 :] + prompts[:i]))
        answer = answer[: [3, 120, 30, 60, 45, 20, 80][i]]
        rows.append((ids + answer, [0] * len(ids) + [1] * len(answer)))
    assert len({len(ids) for ids, _ in rows}) >= 5
    max_length = 100
    assert any(len(ids) > max_length for ids, _ in rows)

    calls: list[int] = []
    batched = teacher_forced(
        smollm2, drafter, rows, max_length, lambda: calls.append(1), row_tokens=400,
        query_tokens=160,
    )  # fmt: skip
    # The pass as it was: each row alone, all its anchors at once.
    alone = teacher_forced(smollm2, drafter, rows, max_length, row_tokens=1, query_tokens=10**9)
    acc, tau = batched
    assert 1 < len(calls) < len(rows) - 1  # rows did share forwards; the short one is skipped
    assert len(acc) == drafter.config.block_size - 1 and acc[0] > 0.1  # a random drafter: 0
    torch.testing.assert_close(torch.tensor(acc), torch.tensor(alone[0]), atol=1e-6, rtol=0)
    assert tau == pytest.approx(alone[1], abs=1e-5)
    # tau is what rounds would accept: 1 + the mean leading run of right drafts over every
    # block, here from each block scored alone (its slots' hits, then their leading run).
    leading = []
    for ids, mask in rows:
        ids, mask = ids[:max_length], mask[:max_length]
        seq, loss_mask = torch.tensor([ids]), torch.tensor([mask])
        context = extract_context(smollm2, seq, None, list(drafter.config.target_layer_ids))
        count = anchor_count(mask, drafter.config.block_size)
        if not count:
            continue
        anchors, valid = every_anchor(
            loss_mask, torch.tensor([len(ids)]), drafter.config.block_size, count
        )
        for i in range(count):
            out = dflash_forward_loss(
                drafter, smollm2.embed_tokens, smollm2.lm_head, context, seq, loss_mask,
                anchors[:, i : i + 1], valid[:, i : i + 1],
            )  # fmt: skip
            leading.append(int(out.slot_correct.cumprod(0).sum()))
    assert tau == pytest.approx(1 + sum(leading) / len(leading), abs=1e-5)
    assert tau > tau_from_slot_acc(acc)  # the accuracies multiplied: misses come together
