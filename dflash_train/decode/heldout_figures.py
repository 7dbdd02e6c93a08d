"""The figures of one held-out evaluation, computed the same way in the run and by
`dflash-train eval --run-dir`: real speculative decoding on the first K held-out prompts
(greedy, lossless check: batched in the run, batch_decode.evaluate_batched; one at a time by
`eval`, speculative.evaluate_prompts; the same tokens and rounds either way) and the
teacher-forced per-slot acceptance on the held-out answers (every anchor of every answer,
no sampling)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dflash_train.decode.speculative import EvalSummary, with_block_size
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import Target

Row = tuple[Sequence[int], Sequence[int]]


@torch.no_grad()
def teacher_forced(
    target: Target,
    drafter: DFlashDrafter,
    rows: Sequence[Row],
    max_length: int,
    before_row: Callable[[], None] | None = None,
) -> tuple[list[float], float | None]:
    """Per-slot acceptance (slot j right given slots < j right, as the training tau reads
    it) over every anchor of each answer, and the tau it implies; ([], None) without rows.
    One row at a time: the target's features of the row, then all its blocks at once.
    `before_row()` runs before each row (the in-run evaluation raises there to give way)."""
    from dflash_train.model.dflash_loss import (
        dflash_forward_loss,
        sample_anchors,
        tau_from_slot_acc,
    )
    from dflash_train.targets.frozen_target import extract_context

    view = with_block_size(drafter, None)  # dense-mask attention: any row length, no compile
    size = drafter.config.block_size
    device = target.device
    # Summed where they are made, read once at the end: a read per row made the host wait
    # for the device every row, where it can queue the next row's kernels instead.
    correct = torch.zeros(size - 1, dtype=torch.float64, device=device)
    total = torch.zeros(size - 1, dtype=torch.float64, device=device)
    for ids, mask in rows:
        if before_row is not None:
            before_row()
        ids, mask = list(ids)[:max_length], list(mask)[:max_length]
        if not _has_anchor(mask, size):
            continue
        seq = torch.tensor([ids], device=device)
        loss_mask = torch.tensor([mask], device=device)
        context = extract_context(target, seq, None, list(drafter.config.target_layer_ids))
        anchors, valid = sample_anchors(loss_mask, len(ids), size)
        out = dflash_forward_loss(
            view, target.embed_tokens, target.lm_head, context, seq, loss_mask, anchors, valid
        )
        correct += out.slot_correct.double()
        total += out.slot_total.double()
    correct, total = correct.cpu(), total.cpu()
    if not float(total.sum()):
        return [], None
    acc = (correct / total.clamp_min(1)).tolist()
    return acc, tau_from_slot_acc(acc)


def _has_anchor(mask: Sequence[int], size: int) -> bool:
    """Whether a row of this loss mask has an anchor (sample_anchors' rule, on the host):
    a position t with mask[t] and mask[t + 1] set whose block t..t+size-1 fits in the row."""
    return any(mask[t] and mask[t + 1] for t in range(len(mask) - size + 1))


def teacher_forced_fields(
    slot_acc: Sequence[float], tau_tf: float, block_size: int
) -> dict[str, Any]:
    """The `eval` event's figures when nothing was decoded (a hybrid target): the
    teacher-forced ones alone, the decoding ones null or zero."""
    return {
        "tau": None,
        "tau_tf": round(tau_tf, 4),
        "slot_acc": [round(a, 4) for a in slot_acc],
        "lossless": None,
        "prompts": 0,
        "tokens": 0,
        "generated_tokens": 0,
        "blocks": 0,
        "block_size": block_size,
    }


def event_fields(
    summary: EvalSummary, slot_acc: Sequence[float], tau_tf: float | None, tokens: int
) -> dict[str, Any]:
    """The `eval` event's figures (protocol.EVENT_CODE_FIELDS), without step and seconds."""
    return {
        "tau": round(summary.tau, 4),
        "tau_tf": None if tau_tf is None else round(tau_tf, 4),
        "slot_acc": [round(a, 4) for a in slot_acc],
        "lossless": summary.lossless,
        "prompts": summary.prompts,
        "tokens": tokens,
        "generated_tokens": summary.generated_tokens,
        "blocks": summary.blocks,
        "block_size": summary.block_size,
    }
