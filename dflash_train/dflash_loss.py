"""The DFlash training objective: sample anchors, draft every block of a batch in one
forward, and score slot j against the token at anchor+j (same position, not shifted).
Everything stays on the device; nothing here calls .item()."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dflash_train.drafter import DFlashDrafter

# Rows of (logits over the vocab) per lm_head chunk: bounds the float32 logits held at once
# to about 512 MiB whatever the vocab.
LOGIT_ELEMENTS_PER_CHUNK = 1 << 27


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    slot_correct: torch.Tensor  # [block_size-1] float: argmax == label, counted where weighted
    slot_total: torch.Tensor  # [block_size-1] float: labels counted per slot
    weight_sum: torch.Tensor  # scalar: sum of loss weights (0 when nothing was scored)


def decay_gamma(block_size: int) -> float:
    """DFLASH.md: gamma 7 for block 16, scaled with the block size."""
    return 7.0 * block_size / 16.0


def slot_decay(block_size: int, device: torch.device | None = None) -> torch.Tensor:
    """exp(-(j-1)/gamma) for slots j = 1..block_size-1."""
    j = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(j - 1) / decay_gamma(block_size))


def sample_anchors(
    loss_mask: torch.Tensor,
    num_anchors: int,
    block_size: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `num_anchors` distinct anchors per row, sorted: positions t with loss_mask[t]
    and loss_mask[t+1] set whose whole block t..t+block_size-1 fits in the row. Rows with
    fewer candidates pad with valid=False. `generator` lives on loss_mask's device."""
    batch, length = loss_mask.shape
    mask = loss_mask.bool()
    candidate = torch.zeros_like(mask)
    last = length - block_size  # the last anchor whose block fits
    if last >= 0:
        candidate[:, : last + 1] = mask[:, : last + 1] & mask[:, 1 : last + 2]
    picks = min(num_anchors, length)
    scores = torch.rand(batch, length, generator=generator, device=loss_mask.device)
    scores = scores.masked_fill(~candidate, -1.0)
    chosen = scores.topk(picks, dim=1).indices
    valid = candidate.gather(1, chosen)
    # Valid anchors first, in position order; invalid ones after them, pointing at 0.
    key = torch.where(valid, chosen, chosen + length).sort(dim=1).values
    valid = key < length
    return torch.where(valid, key, torch.zeros_like(key)), valid


def tau_from_slot_acc(acc: Sequence[float]) -> float:
    """Expected acceptance length 1 + sum_k prod_{j<=k} a_j (teacher-forced upper bound)."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= float(a)
        tau += run
    return tau


def _chunk_ce(
    hidden: torch.Tensor, labels: torch.Tensor, lm_head: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = lm_head(hidden).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    correct = (logits.detach().argmax(dim=-1) == labels).float()
    return ce, correct


def _slot_cross_entropy(
    hidden: torch.Tensor, labels: torch.Tensor, lm_head: nn.Module, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row CE and correctness. Rows are chunked and each chunk's logits recomputed in
    backward (checkpoint), so full-vocab float32 logits never exist for all rows at once."""
    rows = hidden.shape[0]
    chunk = max(1, LOGIT_ELEMENTS_PER_CHUNK // max(vocab, 1))
    if rows <= chunk:
        return _chunk_ce(hidden, labels, lm_head)
    ces, corrects = [], []
    for start in range(0, rows, chunk):
        part = slice(start, start + chunk)
        if torch.is_grad_enabled():
            ce, correct = checkpoint(
                _chunk_ce, hidden[part], labels[part], lm_head, use_reentrant=False
            )
        else:
            ce, correct = _chunk_ce(hidden[part], labels[part], lm_head)
        ces.append(ce)
        corrects.append(correct)
    return torch.cat(ces), torch.cat(corrects)


def _as_autograd_input(tensor: torch.Tensor) -> torch.Tensor:
    # Hidden states made under inference_mode cannot be saved for backward; a same-device
    # .to() in the caller returns them unchanged, so copy here.
    return tensor.clone() if tensor.is_inference() else tensor


def dflash_forward_loss(
    drafter: nn.Module,
    target_embed: nn.Embedding,
    target_lm_head: nn.Module,
    context: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
) -> LossOutput:
    """context [B, S, k*H] (target features), input_ids/loss_mask [B, S], anchors/valid
    [B, N] from sample_anchors. All blocks of the batch go through the drafter at once.
    `drafter` may be wrapped (DDP); its config is read from the unwrapped module."""
    core = drafter
    while not isinstance(core, DFlashDrafter):
        core = getattr(core, "module", None) or core._orig_mod
    size = core.config.block_size
    context = _as_autograd_input(context)
    input_ids = _as_autograd_input(input_ids)
    loss_mask = _as_autograd_input(loss_mask)
    batch, length = input_ids.shape
    blocks = anchors.shape[1]

    anchor_tokens = input_ids.gather(1, anchors)
    block_embeds = core.embed_blocks(target_embed, anchor_tokens)
    hidden = drafter(block_embeds, context, anchors, valid)
    hidden = hidden.view(batch, blocks, size, -1)[:, :, 1:]  # slot 0 (the anchor) has no loss

    # Slot j predicts the token AT anchor+j: the block input already holds the anchor at
    # slot 0, so slot j's label is at the same offset, not shifted by one.
    positions = anchors[:, :, None] + torch.arange(1, size, device=anchors.device)
    inside = positions < length
    positions = positions.clamp(max=length - 1)
    labels = input_ids.gather(1, positions.view(batch, -1)).view(positions.shape)
    counted = loss_mask.gather(1, positions.view(batch, -1)).view(positions.shape).float()
    counted = counted * inside * valid[:, :, None]
    weights = counted * slot_decay(size, device=counted.device)

    vocab = int(target_embed.weight.shape[0])
    ce, correct = _slot_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1), target_lm_head, vocab
    )
    ce = ce.view(weights.shape)
    correct = correct.view(weights.shape)
    weight_sum = weights.sum()
    loss = (ce * weights).sum() / weight_sum.clamp_min(1e-6)
    return LossOutput(
        loss=loss,
        slot_correct=(correct * counted).sum(dim=(0, 1)),
        slot_total=counted.sum(dim=(0, 1)),
        weight_sum=weight_sum.detach(),
    )
