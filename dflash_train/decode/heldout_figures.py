"""The figures of one held-out evaluation, computed the same way in the run and by
`dflash-train eval --run-dir`: real speculative decoding on the first K held-out prompts
(greedy, lossless check: batched in the run, batch_decode.evaluate_batched; one at a time by
`eval`, evaluation.evaluate_prompts; the same tokens and rounds either way) and the
teacher-forced per-slot acceptance on the held-out answers (every anchor of every answer,
no sampling)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dflash_train.decode.evaluation import EvalSummary
from dflash_train.decode.speculative import with_block_size
from dflash_train.model.drafter import DFlashDrafter
from dflash_train.targets.frozen_target import Target

Row = tuple[Sequence[int], Sequence[int]]
_Counted = tuple[list[int], list[int], int]  # ids, loss mask, anchors


# Padded tokens of one target forward, and block queries of one drafter pass. The dense-mask
# attention's cost grows with the queries times the keys, so a row's anchors go in slices:
# all of a 2,048-token row's at once were 32,768 queries. Within these bounds rows of like
# length share a forward: one row at a time was a launch-bound ~46 ms a row on the H200.
# A CPU wants small passes (its caches: 12 rows of 296-456 tokens took 18.4 s a row at a
# time, 21.7 s at 8,192 queries a pass, 15.7 s at 1,024); a GPU wants few (its launches).
ROW_TOKENS = 8192
QUERY_TOKENS = {"cpu": 1024, "cuda": 8192}


@torch.no_grad()
def teacher_forced(
    target: Target,
    drafter: DFlashDrafter,
    rows: Sequence[Row],
    max_length: int,
    before_batch: Callable[[], None] | None = None,
    *,
    row_tokens: int = ROW_TOKENS,
    query_tokens: int | None = None,
) -> tuple[list[float], float | None]:
    """Per-slot accuracy over every anchor of each answer and the acceptance length of
    those blocks (the leading run of right drafts, as the training tau reads it); ([],
    None) without rows.
    Rows of like length share a right-padded target forward (causal: the padding changes
    no real position) of at most `row_tokens` tokens; their blocks go through the drafter
    `query_tokens` queries at a time (QUERY_TOKENS for the device when None).
    `before_batch()` runs before each forward (the in-run evaluation raises there to give
    way)."""
    from dflash_train.model.dflash_loss import dflash_forward_loss, every_anchor, tau_from_sums
    from dflash_train.targets.frozen_target import extract_context

    view = with_block_size(drafter, None)  # dense-mask attention: any row length, no compile
    size = drafter.config.block_size
    device = target.device
    if query_tokens is None:
        query_tokens = QUERY_TOKENS.get(device.type, QUERY_TOKENS["cuda"])
    cut = [(list(ids)[:max_length], list(mask)[:max_length]) for ids, mask in rows]
    counted = [(ids, mask, anchor_count(mask, size)) for ids, mask in cut]
    # Longest first, so that a batch's rows are of like length and its padding small.
    kept = sorted((r for r in counted if r[2]), key=lambda r: len(r[0]), reverse=True)
    # Summed where they are made, read once at the end: a read per batch made the host wait
    # for the device, where it can queue the next batch's kernels instead.
    sums = torch.zeros(4, size - 1, dtype=torch.float64, device=device)  # LossOutput.slot_sums
    for batch in _batches(kept, row_tokens):
        if before_batch is not None:
            before_batch()
        width = len(batch[0][0])
        seq = torch.tensor([ids + [0] * (width - len(ids)) for ids, _, _ in batch], device=device)
        loss_mask = torch.tensor(
            [mask + [0] * (width - len(mask)) for _, mask, _ in batch], device=device
        )
        lengths = torch.tensor([len(ids) for ids, _, _ in batch], device=device)
        context = extract_context(target, seq, None, list(drafter.config.target_layer_ids))
        anchors, valid = every_anchor(loss_mask, lengths, size, max(n for *_, n in batch))
        step = max(1, query_tokens // (len(batch) * size))
        for first in range(0, anchors.shape[1], step):
            out = dflash_forward_loss(
                view, target.embed_tokens, target.lm_head, context, seq, loss_mask,
                anchors[:, first : first + step], valid[:, first : first + step],
            )  # fmt: skip
            sums += out.slot_sums()
    sums = sums.cpu()
    correct, total = sums[0], sums[1]
    if not float(total.sum()):
        return [], None
    return (correct / total.clamp_min(1)).tolist(), tau_from_sums(sums)


def _batches(rows: list[_Counted], row_tokens: int) -> list[list[_Counted]]:
    """`rows` (longest first) cut into runs whose padded size (rows x the first's length)
    stays within `row_tokens` and whose rows are at least 7/8 of the first's length: the
    target's forward over the padding is work for nothing, which a CPU pays in full."""
    batches: list[list[_Counted]] = []
    for row in rows:
        batch = batches[-1] if batches else []
        width = len(batch[0][0]) if batch else 0
        if batch and (len(batch) + 1) * width <= row_tokens and 8 * len(row[0]) >= 7 * width:
            batch.append(row)
        else:
            batches.append([row])
    return batches


def anchor_count(mask: Sequence[int], size: int) -> int:
    """A row's anchors (sample_anchors' rule, on the host): positions t with mask[t] and
    mask[t + 1] set whose block t..t+size-1 fits in the row."""
    return sum(1 for t in range(len(mask) - size + 1) if mask[t] and mask[t + 1])


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
        "mismatched": len(summary.mismatches),
        "prompts": summary.prompts,
        "tokens": tokens,
        "generated_tokens": summary.generated_tokens,
        "blocks": summary.blocks,
        "block_size": summary.block_size,
        "round_lengths": list(summary.round_lengths),
    }
