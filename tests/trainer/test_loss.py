"""The training objective's semantics, pinned: anchors, masks, labels, weights, gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from drafter_fixtures import VOCAB, frozen_head, random_context, tiny_drafter
from torch import nn

from dflash_train.model import dflash_loss
from dflash_train.model.dflash_loss import (
    dflash_forward_loss,
    sample_anchors,
    slot_decay,
    tau_from_slot_acc,
)
from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
from dflash_train.model.mask_token import choose_mask
from dflash_train.targets.frozen_target import Target, extract_context

SIZE = 4  # the tiny drafter's block size


def _block_logits(
    drafter: DFlashDrafter,
    context: torch.Tensor,
    anchor_tokens: torch.Tensor,
    anchors: torch.Tensor,
) -> torch.Tensor:
    embed, head = frozen_head()
    hidden = drafter(drafter.embed_blocks(embed, anchor_tokens), context, anchors)
    return head(hidden).view(anchors.shape[0], anchors.shape[1], SIZE, VOCAB)


def test_sample_anchors_picks_valid_fitting_positions() -> None:
    loss_mask = torch.tensor(
        [
            [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1],
            [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1],  # no two set in a row
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        ]
    )
    generator = torch.Generator().manual_seed(0)
    anchors, valid = sample_anchors(loss_mask, 5, SIZE, generator)
    assert anchors.shape == valid.shape == (3, 5)
    assert not valid[1].any()
    assert valid[0].sum() == 5 and valid[2].sum() == 5
    for row in (0, 2):
        picked = anchors[row][valid[row]].tolist()
        assert picked == sorted(set(picked))
        for t in picked:
            assert loss_mask[row, t] == 1 and loss_mask[row, t + 1] == 1
            assert t + SIZE <= loss_mask.shape[1]  # the whole block fits
    # Row 0's candidates are 2..6 and 10 (11..13 would run past the end).
    assert set(anchors[0].tolist()) <= {2, 3, 4, 5, 6, 10}
    again = sample_anchors(loss_mask, 5, SIZE, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], anchors) and torch.equal(again[1], valid)


def test_sample_anchors_pads_short_rows_and_tiny_sequences() -> None:
    anchors, valid = sample_anchors(torch.tensor([[1, 1, 1, 1, 1, 0]]), 8, SIZE)
    assert anchors.shape == (1, 6)
    assert anchors[0][valid[0]].tolist() == [0, 1, 2]  # block 2..5 still fits
    assert (anchors[0][~valid[0]] == 0).all()
    anchors, valid = sample_anchors(torch.ones(1, 3, dtype=torch.long), 4, SIZE)
    assert not valid.any()


def test_tau_from_slot_acc() -> None:
    assert tau_from_slot_acc([]) == 1.0
    assert tau_from_slot_acc([0.0, 1.0]) == 1.0
    assert tau_from_slot_acc([1.0] * 15) == 16.0
    assert math.isclose(tau_from_slot_acc([0.5, 0.5]), 1 + 0.5 + 0.25)


def test_slot_decay_scales_gamma_with_block_size() -> None:
    torch.testing.assert_close(slot_decay(16)[:2], torch.tensor([1.0, math.exp(-1 / 7)]))
    torch.testing.assert_close(slot_decay(8)[1], torch.tensor(math.exp(-1 / 3.5)))
    assert slot_decay(16).shape == (15,)


def test_a_block_sees_only_context_before_its_anchor() -> None:
    """(a) + (d): features at positions >= anchor never reach the block; the mask is
    strictly `< anchor`, so even the anchor's own position is hidden (it enters as slot 0)."""
    drafter = tiny_drafter()
    anchors = torch.tensor([[3, 7]])
    tokens = torch.tensor([[5, 6]])
    context = random_context(1, 12)
    base = _block_logits(drafter, context, tokens, anchors)
    for position, first_changes in [(3, False), (7, False), (11, False), (2, True), (0, True)]:
        changed = context.clone()
        changed[:, position] += 1.0
        out = _block_logits(drafter, changed, tokens, anchors)
        assert torch.equal(out[:, 0], base[:, 0]) != first_changes, position
    # Block 1 (anchor 7) sees positions 3..6 but not 7.
    changed = context.clone()
    changed[:, 6] += 1.0
    assert not torch.equal(_block_logits(drafter, changed, tokens, anchors)[:, 1], base[:, 1])
    changed = context.clone()
    changed[:, 7] += 1.0
    torch.testing.assert_close(_block_logits(drafter, changed, tokens, anchors), base)


def test_blocks_do_not_see_each_other() -> None:
    """(b) changing one block's tokens leaves the other blocks alone."""
    drafter = tiny_drafter(num_layers=2)
    anchors = torch.tensor([[2, 5, 8]])
    context = random_context(1, 12)
    base = _block_logits(drafter, context, torch.tensor([[1, 2, 3]]), anchors)
    out = _block_logits(drafter, context, torch.tensor([[1, 9, 3]]), anchors)
    assert not torch.equal(out[:, 1], base[:, 1])
    torch.testing.assert_close(out[:, 0], base[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 2], base[:, 2], rtol=0, atol=0)


def _reference_loss(
    drafter: DFlashDrafter,
    context: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    shift: int,
    teacher: torch.Tensor | None = None,
    distill: float = 0.0,
) -> torch.Tensor:
    """Written out slot by slot: slot j's label is input_ids[anchor + j + shift]; with a
    teacher, (1 - d) CE + d KL(p || drafter) with p = softmax(head(teacher at the label's
    position - 1))."""
    _, head = frozen_head()
    logits = _block_logits(drafter, context, input_ids.gather(1, anchors), anchors)
    decay = slot_decay(SIZE)
    total, weight_sum = torch.zeros(()), torch.zeros(())
    for b in range(anchors.shape[0]):
        for i, anchor in enumerate(anchors[b].tolist()):
            for j in range(1, SIZE):
                position = anchor + j + shift
                weight = decay[j - 1] * loss_mask[b, position]
                ce = F.cross_entropy(logits[b, i, j][None], input_ids[b, position][None])
                if teacher is not None:
                    p = head(teacher[b, position - 1]).log_softmax(-1)
                    kl = F.kl_div(
                        logits[b, i, j].log_softmax(-1), p, log_target=True, reduction="sum"
                    )
                    ce = (1 - distill) * ce + distill * kl
                total = total + weight * ce
                weight_sum = weight_sum + weight
    return total / weight_sum


def test_slot_j_is_scored_against_the_token_at_anchor_plus_j() -> None:
    """(c) the label is NOT shifted by one (the public trainer's bug)."""
    drafter = tiny_drafter()
    embed, head = frozen_head()
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=generator)
    loss_mask = torch.ones(2, 16, dtype=torch.long)
    loss_mask[1, 9] = 0  # slot 1 of the block anchored at 8 goes unscored
    anchors = torch.tensor([[1, 6, 10], [0, 4, 8]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    context = random_context(2, 16)
    out = dflash_forward_loss(drafter, embed, head, context, input_ids, loss_mask, anchors, valid)
    same = _reference_loss(drafter, context, input_ids, loss_mask, anchors, shift=0)
    shifted = _reference_loss(drafter, context, input_ids, loss_mask, anchors, shift=1)
    torch.testing.assert_close(out.loss, same)
    assert not torch.isclose(out.loss, shifted)
    assert out.slot_total.tolist() == [5.0, 6.0, 6.0]
    torch.testing.assert_close(out.weight_sum, (slot_decay(SIZE) * out.slot_total).sum())


ANCHORS, BOTH_VALID = torch.tensor([[2, 6]]), torch.tensor([[True, True]])


def _two_blocks() -> tuple[
    DFlashDrafter, nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor
]:
    """A tiny drafter, its frozen embedding and head, a random context and ids of one row,
    and the drafter's logits [1, 2, SIZE, VOCAB] for blocks anchored at 2 and 6 (ANCHORS)."""
    drafter = tiny_drafter()
    embed, head = frozen_head()
    input_ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    context = random_context(1, 12)
    logits = _block_logits(drafter, context, input_ids.gather(1, ANCHORS), ANCHORS)
    return drafter, embed, head, context, input_ids, logits


def test_slot_accuracy_counts_argmax_hits_at_the_same_position() -> None:
    drafter, embed, head, context, input_ids, logits = _two_blocks()
    anchors, valid = ANCHORS, BOTH_VALID
    # Make the labels what the drafter predicts at slots 1 and 3 of block 0.
    ids = input_ids.clone()
    ids[0, 3] = logits[0, 0, 1].argmax()
    ids[0, 5] = logits[0, 0, 3].argmax()
    ids[0, 4] = (logits[0, 0, 2].argmax() + 1) % VOCAB
    ids[0, 7:10] = (logits[0, 1, 1:].argmax(-1) + 1) % VOCAB
    ones = torch.ones_like(ids)
    out = dflash_forward_loss(drafter, embed, head, context, ids, ones, anchors, valid)
    assert out.slot_correct.tolist() == [1.0, 0.0, 1.0]
    assert out.slot_total.tolist() == [2.0, 2.0, 2.0]


def test_run_counts_keep_each_blocks_leading_run_of_right_drafts() -> None:
    """What a round accepts is the leading run of right drafts: tau from the run counts is
    1 + the mean run, where the slots' accuracies multiplied read low when misses come
    together."""
    drafter, embed, head, context, input_ids, logits = _two_blocks()
    anchors, valid = ANCHORS, BOTH_VALID
    predicted = logits.argmax(-1)  # [1, blocks, SIZE]
    ids = input_ids.clone()
    # block 0 (labels at 3..5): right, right, wrong; block 1 (7..9): wrong, wrong, right
    ids[0, 3:6] = predicted[0, 0, 1:] + torch.tensor([0, 0, 1])
    ids[0, 7:10] = predicted[0, 1, 1:] + torch.tensor([1, 1, 0])
    ids = ids % VOCAB
    ones = torch.ones_like(ids)
    out = dflash_forward_loss(drafter, embed, head, context, ids, ones, anchors, valid)
    assert out.slot_correct.tolist() == [1.0, 1.0, 1.0]
    assert out.run_correct.tolist() == [1.0, 1.0, 0.0]  # runs of 2 and 0
    assert out.run_total.tolist() == [2.0, 1.0, 1.0]
    runs = (out.run_correct / out.run_total).tolist()
    assert tau_from_slot_acc(runs) == 1 + (2 + 0) / 2
    assert tau_from_slot_acc((out.slot_correct / out.slot_total).tolist()) == 1.875
    # A label past the answer's end (loss mask 0) ends block 0's count at its slot 3.
    mask = ones.clone()
    mask[0, 5] = 0
    cut = dflash_forward_loss(drafter, embed, head, context, ids, mask, anchors, valid)
    assert cut.run_correct.tolist() == [1.0, 1.0, 0.0]
    assert cut.run_total.tolist() == [2.0, 1.0, 0.0]


def test_invalid_anchors_carry_no_loss() -> None:
    drafter = tiny_drafter()
    embed, head = frozen_head()
    input_ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    ones = torch.ones_like(input_ids)
    context = random_context(1, 12)
    one = dflash_forward_loss(
        drafter, embed, head, context, input_ids, ones, torch.tensor([[2]]), torch.tensor([[True]])
    )
    two = dflash_forward_loss(
        drafter,
        embed,
        head,
        context,
        input_ids,
        ones,
        torch.tensor([[2, 0]]),
        torch.tensor([[True, False]]),
    )
    torch.testing.assert_close(one.loss, two.loss)
    assert torch.equal(one.slot_total, two.slot_total)
    none = dflash_forward_loss(
        drafter, embed, head, context, input_ids, ones, torch.tensor([[2]]), torch.tensor([[False]])
    )
    assert none.loss.item() == 0.0 and none.weight_sum.item() == 0.0


def test_chunked_cross_entropy_matches_and_backpropagates(monkeypatch: pytest.MonkeyPatch) -> None:
    embed, head = frozen_head()
    input_ids = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(6))
    ones = torch.ones_like(input_ids)
    anchors, valid = sample_anchors(ones, 3, SIZE, torch.Generator().manual_seed(1))
    context = random_context(2, 14)
    results = []
    for chunk_elements in (1 << 27, VOCAB * 4):  # one chunk; chunks of 4 rows
        monkeypatch.setattr(dflash_loss, "LOGIT_ELEMENTS_PER_CHUNK", chunk_elements)
        drafter = tiny_drafter()
        out = dflash_forward_loss(drafter, embed, head, context, input_ids, ones, anchors, valid)
        out.loss.backward()
        results.append((out, drafter.fc.weight.grad.clone()))
    (full, full_grad), (chunked, chunked_grad) = results
    torch.testing.assert_close(chunked.loss, full.loss)
    torch.testing.assert_close(chunked_grad, full_grad)
    assert torch.equal(chunked.slot_correct, full.slot_correct)


def test_loss_falls_on_a_fixed_batch() -> None:
    """(e) ~30 AdamW steps on one batch drive the loss down."""
    drafter = tiny_drafter(num_layers=1)
    embed, head = frozen_head()
    input_ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(7))
    ones = torch.ones_like(input_ids)
    anchors, valid = sample_anchors(ones, 6, SIZE, torch.Generator().manual_seed(2))
    context = random_context(2, 24)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = dflash_forward_loss(drafter, embed, head, context, input_ids, ones, anchors, valid)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_gradients_never_reach_the_target(tiny_target: Target) -> None:
    """(f) the real (tiny) target feeds context, embedding and lm_head; none gets a gradient,
    and hidden states made under inference_mode are usable for the drafter's backward."""
    # The learned mask (now only on request) must get its gradient too.
    learned = choose_mask(tiny_target.tokenizer, tiny_target.vocab_size, None, "learned")
    config = drafter_config_for_target(tiny_target, num_layers=1, block_size=SIZE, mask=learned)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config)
    input_ids = torch.randint(0, 1000, (2, 20), generator=torch.Generator().manual_seed(8))
    attention = torch.ones_like(input_ids)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, :5] = 0
    with torch.inference_mode():  # as the target workers run it
        context = extract_context(tiny_target, input_ids, attention, config.target_layer_ids)
    assert context.is_inference()
    anchors, valid = sample_anchors(loss_mask, 4, SIZE, torch.Generator().manual_seed(3))
    out = dflash_forward_loss(
        drafter,
        tiny_target.embed_tokens,
        tiny_target.lm_head,
        context,
        input_ids,
        loss_mask,
        anchors,
        valid,
    )
    out.loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in tiny_target.model.parameters())
    assert drafter.fc.weight.grad is not None and drafter.mask_embedding.grad is not None
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("distill", [0.3, 1.0])
def test_distillation_mixes_the_targets_distribution_at_the_labels_position(
    distill: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train --distill: the fused loss and its gradients equal the loss written out with the
    target's distribution one position before each label, in chunks as in one piece."""
    embed, head = frozen_head()
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(11))
    loss_mask = torch.ones_like(input_ids)
    loss_mask[0, 13:] = 0
    anchors, valid = sample_anchors(loss_mask, 3, SIZE, torch.Generator().manual_seed(4))
    context = random_context(2, 16)
    teacher = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(5)) * 3
    want_drafter = tiny_drafter()
    want = _reference_loss(
        want_drafter, context, input_ids, loss_mask, anchors, 0, teacher, distill
    )
    want.backward()
    for chunk_elements in (1 << 27, VOCAB * 8):  # one chunk; chunks of 4 rows (halved)
        monkeypatch.setattr(dflash_loss, "LOGIT_ELEMENTS_PER_CHUNK", chunk_elements)
        drafter = tiny_drafter()
        out = dflash_forward_loss(
            drafter, embed, head, context, input_ids, loss_mask, anchors, valid, teacher, distill
        )
        out.loss.backward()
        torch.testing.assert_close(out.loss, want)
        for name, param in drafter.named_parameters():
            torch.testing.assert_close(
                param.grad, dict(want_drafter.named_parameters())[name].grad, msg=name
            )
    plain = dflash_forward_loss(
        tiny_drafter(), embed, head, context, input_ids, loss_mask, anchors, valid
    )
    assert not torch.allclose(plain.loss, want)  # the teacher changed the objective
    off = dflash_forward_loss(
        tiny_drafter(), embed, head, context, input_ids, loss_mask, anchors, valid, teacher, 0.0
    )
    assert torch.equal(off.loss, plain.loss)  # distill 0: the teacher is not read


def test_the_held_out_passes_anchors_are_sample_anchors_rule() -> None:
    """The held-out pass counts a row's anchors on the host (no device read a batch) and
    takes every anchor of right-padded rows at once: both must agree with sample_anchors on
    each row alone, for every kind of mask (short rows, answers too short for a block,
    masks ending at the row's end)."""
    from dflash_train.decode.heldout_figures import anchor_count
    from dflash_train.model.dflash_loss import every_anchor

    generator = torch.Generator().manual_seed(3)
    masks = [[1], [1, 1], [0] * 5 + [1] * 3, [1, 0] * 6, [1] * 9]
    for _ in range(200):
        length = int(torch.randint(1, 24, (1,), generator=generator))
        masks.append(torch.randint(0, 2, (length,), generator=generator).tolist())
    seen = set()
    for size in (2, 4, 8):
        alone = [sample_anchors(torch.tensor([m]), len(m), size) for m in masks]
        counts = [int(valid.sum()) for _, valid in alone]
        assert [anchor_count(m, size) for m in masks] == counts, size
        assert anchor_count([], size) == 0
        seen.update(n > 0 for n in counts)
        width = max(len(m) for m in masks)
        padded = torch.tensor([m + [0] * (width - len(m)) for m in masks])
        lengths = torch.tensor([len(m) for m in masks])
        anchors, valid = every_anchor(padded, lengths, size, max(counts))
        for row, (want_anchors, want_valid) in enumerate(alone):
            got = anchors[row][valid[row]].tolist()
            assert got == want_anchors[0][want_valid[0]].tolist(), (masks[row], size)
            assert int(valid[row].sum()) == counts[row]
    assert seen == {True, False}
