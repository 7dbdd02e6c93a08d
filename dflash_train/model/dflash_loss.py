"""The DFlash training objective: sample anchors, draft every block of a batch in one
forward, and score slot j against the token at anchor+j (same position, not shifted).
Everything stays on the device; the only host sync is the count of rows that carry loss
(rows of weight 0 skip the lm_head)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dflash_train.model import liger_ce
from dflash_train.model.compile_guard import GUARD
from dflash_train.model.drafter import DFlashDrafter

# Logit elements per lm_head chunk: bounds the float32 logits held at once to about 2 GiB
# whatever the vocab (3,532 rows of Qwen3's 151,936).
LOGIT_ELEMENTS_PER_CHUNK = 1 << 29


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    slot_correct: torch.Tensor  # [block_size-1] float: argmax == label, counted where weighted
    slot_total: torch.Tensor  # [block_size-1] float: labels counted per slot
    weight_sum: torch.Tensor  # scalar: sum of loss weights (0 when nothing was scored)
    # What a decoding round would accept: [block_size-1] float, blocks whose slots 1..j are
    # all right (run_correct) of those whose slots 1..j-1 are and whose slot j is counted
    # (run_total). Their ratio is slot j's acceptance given the slots before it.
    run_correct: torch.Tensor
    run_total: torch.Tensor

    def slot_sums(self) -> torch.Tensor:
        """[4, block_size-1]: slot_correct, slot_total, run_correct, run_total, the sums
        a log interval or an evaluation adds up (tau_from_sums reads them)."""
        return torch.stack((self.slot_correct, self.slot_total, self.run_correct, self.run_total))


def decay_gamma(block_size: int) -> float:
    """The DFlash recipe: gamma 7 for block 16, scaled with the block size."""
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


def every_anchor(
    loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every anchor of each row, sorted, as [B, count] (anchors, valid): sample_anchors'
    rule (loss_mask[t] and loss_mask[t+1], block t..t+block_size-1 inside the row) with row
    b ending at lengths[b], so right-padded rows get the anchors each has alone. `count`
    (the most any row has, known on the host) fixes the width without a device read."""
    length = loss_mask.shape[1]
    mask = loss_mask.bool()
    positions = torch.arange(length, device=loss_mask.device)
    follows = torch.zeros_like(mask)
    follows[:, :-1] = mask[:, 1:]
    candidate = mask & follows & (positions <= (lengths[:, None] - block_size))
    key = torch.where(candidate, positions, positions + length).sort(dim=1).values[:, :count]
    valid = key < length
    return torch.where(valid, key, torch.zeros_like(key)), valid


def tau_from_slot_acc(acc: Sequence[float]) -> float:
    """Expected acceptance length 1 + sum_k prod_{j<=k} a_j, where a_j is slot j's
    acceptance GIVEN slots < j accepted (LossOutput.run_correct / run_total). Fed each
    slot's own accuracy it reads low: a drafter's misses come together, so P(slots 1..k
    right) is above the product of the slots' accuracies (run 4's export on its held-out
    answers, teacher-forced: 1.99 from the accuracies, 2.28 from the runs; 2.06 decoded)."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= float(a)
        tau += run
    return tau


def tau_from_sums(sums: torch.Tensor) -> float:
    """The acceptance length of the blocks whose LossOutput.slot_sums() `sums` adds up."""
    _, _, run_correct, run_total = sums
    return tau_from_slot_acc((run_correct / run_total.clamp_min(1)).tolist())


def _ce_only(
    logits: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor | None, distill: float
) -> tuple[torch.Tensor, torch.Tensor]:
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    ce = lse - lf.gather(1, labels[:, None]).squeeze(1)
    if teacher is not None:
        ce = (1.0 - distill) * ce + distill * _kl(lf, lse, teacher.float())
    return ce, (lf.argmax(dim=-1) == labels).float()


def _kl(lf: torch.Tensor, lse: torch.Tensor, tf: torch.Tensor) -> torch.Tensor:
    """KL(softmax(tf) || softmax(lf)) per row: the soft term's cross-entropy less the
    target's entropy, so a distilled run's loss still falls towards 0 (same gradient)."""
    return (torch.softmax(tf, dim=-1) * (tf - lf)).sum(dim=-1) - torch.logsumexp(tf, dim=-1) + lse


def _ce_and_grad(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row CE, argmax correctness and w * (softmax - onehot) in the logits' dtype, all
    in float32 arithmetic. Compiled on CUDA (one read of the bf16 logits for the
    reductions, one pass for the gradient); eager elsewhere, same arithmetic."""
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    ce = lse - lf.gather(1, labels[:, None]).squeeze(1)
    correct = (lf.argmax(dim=-1) == labels).float()
    onehot = torch.arange(lf.shape[1], device=lf.device)[None, :] == labels[:, None]
    grad = (torch.exp(lf - lse[:, None]) - onehot.float()) * weights[:, None].float()
    return ce, correct, grad.to(logits.dtype)


def _distill_ce_and_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    teacher: torch.Tensor,
    distill: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """_ce_and_grad against the label distribution (1 - d) onehot + d softmax(teacher): the
    target's own next-token distribution at the label's position, so every row also
    teaches which other tokens the target found likely (`train --distill d`). The loss
    reads (1 - d) CE + d KL."""
    lf = logits.float()
    tf = teacher.float()
    lse = torch.logsumexp(lf, dim=-1)
    soft = torch.softmax(tf, dim=-1)
    hard = lse - lf.gather(1, labels[:, None]).squeeze(1)
    ce = (1.0 - distill) * hard + distill * _kl(lf, lse, tf)
    correct = (lf.argmax(dim=-1) == labels).float()
    onehot = torch.arange(lf.shape[1], device=lf.device)[None, :] == labels[:, None]
    wanted = (1.0 - distill) * onehot.float() + distill * soft
    grad = (torch.exp(lf - lse[:, None]) - wanted) * weights[:, None].float()
    return ce, correct, grad.to(logits.dtype)


# Eager CE kernel -> its compiled version (or itself, once compiling failed).
_COMPILED: dict[Any, Any] = {}

CE_KERNELS = ("auto", "inductor", "liger")
# Which kernel makes a chunk's CE and gradient on a GPU without a teacher: "inductor" (the
# compiled _ce_and_grad), "liger" (liger_ce) or "auto": liger where it is available, else
# inductor. Liger's is half the compiled kernel's time for the same figures (ce_chunk on an
# H100, 2026-12-05: 1.08 against 2.36 ms a chunk; 22 against 45 ms of the Qwen3-8B step).
_ce_kernel = "auto"


def set_ce_kernel(name: str) -> None:
    global _ce_kernel
    if name not in CE_KERNELS:
        raise ValueError(f"ce kernel: {name!r} is not one of {', '.join(CE_KERNELS)}")
    _ce_kernel = name


def ce_kernel_refusal(name: str, device: torch.device) -> str | None:
    """Why `--ce-kernel name` cannot run on `device` (None: it can). Only an explicit liger
    is refused; auto falls back to inductor quietly."""
    if name != "liger" or liger_ce.available():
        return None
    if device.type != "cuda":
        return f"ce_kernel (--ce-kernel): liger runs on a GPU; the drafter is on {device}"
    return "ce_kernel (--ce-kernel): liger needs liger-kernel (pip install 'dflash[liger]')"


def _liger_runs(cuda: bool, distilled: bool) -> bool:
    """The one rule for Liger's kernel: a GPU, no teacher (a distilled loss mixes in the
    target's distribution, which only inductor's kernel does), not turned off, installed."""
    return cuda and not distilled and _ce_kernel != "inductor" and liger_ce.available()


def ce_kernel_in_use(device: torch.device, distill: float = 0.0) -> str:
    """What makes the loss chunks on `device`: liger, inductor (compiled) or eager (the CPU)."""
    if device.type != "cuda":
        return "eager"
    return "liger" if _liger_runs(True, distill > 0) else "inductor"


def _use_liger(logits: torch.Tensor, teacher: torch.Tensor | None) -> bool:
    return _liger_runs(logits.is_cuda, teacher is not None)


def _chunk_kernel(logits: torch.Tensor, eager: Any) -> Any:
    if not logits.is_cuda or logits.shape[0] < 2:
        return eager
    if eager not in _COMPILED:
        # Rows dynamic from the start: the number of rows that carry loss changes per step.
        _COMPILED[eager] = torch.compile(eager, dynamic=True, fullgraph=True)
    return _COMPILED[eager]


def _run_chunk(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    teacher: torch.Tensor | None,
    distill: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    eager: Any = _ce_and_grad if teacher is None else _distill_ce_and_grad
    args = (logits, labels, weights) + (() if teacher is None else (teacher, distill))
    kernel = _chunk_kernel(logits, eager)
    if kernel is eager:
        return kernel(*args)
    try:
        return kernel(*args)
    except Exception as exc:  # no working Triton here: the eager kernel, same numbers
        import logging

        logging.getLogger(__name__).warning("compiled CE kernel failed (%r); eager from now", exc)
        _COMPILED[eager] = eager
        return eager(*args)


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(hidden_i @ W^T, label_i), with per-row CE and argmax-correctness as
    side outputs, in one pass over the logits: each row chunk's logits are made once,
    reduced to the loss terms and turned into the gradient right away (softmax - onehot,
    times w), so nothing is recomputed in backward and full-vocab logits never exist for
    more than one chunk. Backward only scales the stored gradients. With `teacher` (the
    target's final hidden states for the same rows) the label is mixed with the target's
    distribution (_distill_ce_and_grad)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        row_weights: torch.Tensor,
        chunk: int,
        teacher: torch.Tensor | None = None,
        distill: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = hidden.shape[0]
        need_hidden = ctx.needs_input_grad[0]
        need_weight = ctx.needs_input_grad[1]
        w = weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if need_weight
            else None
        )
        ce = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        correct = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        # Near-equal chunks, so no chunk is a lone row (a shape the compiled kernel would
        # recompile for).
        size = -(-rows // max(1, -(-rows // chunk))) if rows else 1
        for start in range(0, rows, size):
            part = slice(start, min(rows, start + size))
            h = hidden[part]
            y = labels[part]
            logits = h @ w.t()  # bf16 products on the GPU, as lm_head() made them
            t = None if teacher is None else teacher[part].to(w.dtype) @ w.t()
            if not (need_hidden or need_weight):
                ce[part], correct[part] = _ce_only(logits, y, t, distill)
                continue
            if _use_liger(logits, t):
                # Unweighted softmax - onehot: the row weights scale the narrow side.
                ce[part], correct[part], grad_logits = liger_ce.ce_and_grad_in_place(logits, y)
                rw = row_weights[part].to(h.dtype)[:, None]
                if grad_hidden is not None:
                    grad_hidden[part] = (grad_logits @ w) * rw
                if grad_weight is not None:
                    grad_weight += (grad_logits.t() @ (h * rw)).float()
                continue
            ce[part], correct[part], grad_logits = _run_chunk(
                logits, y, row_weights[part], t, distill
            )
            if grad_hidden is not None:
                grad_hidden[part] = grad_logits @ w
            if grad_weight is not None:
                grad_weight += (grad_logits.t() @ h).float()
        ctx.save_for_backward(*(t for t in (grad_hidden, grad_weight) if t is not None))
        ctx.has_hidden, ctx.need_weight, ctx.weight_dtype = need_hidden, need_weight, weight.dtype
        ctx.mark_non_differentiable(ce, correct)
        total = (ce * row_weights.float()).sum()
        return total, ce, correct

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, *_: Any) -> tuple[Any, ...]:  # type: ignore[override]
        saved = list(ctx.saved_tensors)
        grad_hidden = grad_weight = None
        if ctx.has_hidden:
            stored = saved.pop(0)
            grad_hidden = stored * grad_total.to(stored.dtype)
        if ctx.need_weight:
            grad_weight = (saved.pop(0) * grad_total).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    teacher: torch.Tensor | None = None,
    distill: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum of w * CE, per-row CE, per-row correct) for hidden [N, H] through a bias-free
    lm_head. Rows whose weight is zero are dropped before the lm_head (one host sync for
    their count); their CE and correct read 0. `teacher` [N, H]: the target's final
    hidden state that predicted each label; CE is then against (1 - distill) onehot +
    distill softmax(teacher @ W^T), and the loss reads (1 - distill) CE + distill KL."""
    weight = lm_head.weight
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError("lm_head: a bias is not supported by the fused cross-entropy")
    if torch.is_autocast_enabled(hidden.device.type):
        hidden = hidden.to(torch.get_autocast_dtype(hidden.device.type))
    rows = hidden.shape[0]
    with GUARD.paused():  # a host sync: other threads may run modules meanwhile
        keep = (row_weights != 0).nonzero().squeeze(1)
    kept = keep.numel()
    chunk = max(1, LOGIT_ELEMENTS_PER_CHUNK // max(int(weight.shape[0]), 1))
    if teacher is not None:
        chunk = max(1, chunk // 2)  # the teacher's logits are held beside the drafter's
    if kept == rows:
        return _LinearCrossEntropy.apply(
            hidden, weight, labels, row_weights, chunk, teacher, distill
        )
    total, ce_kept, correct_kept = _LinearCrossEntropy.apply(
        hidden.index_select(0, keep), weight, labels[keep], row_weights[keep], chunk,
        None if teacher is None else teacher.index_select(0, keep), distill,
    )  # fmt: skip
    ce = ce_kept.new_zeros(rows).index_copy_(0, keep, ce_kept)
    correct = correct_kept.new_zeros(rows).index_copy_(0, keep, correct_kept)
    return total, ce, correct


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
    teacher: torch.Tensor | None = None,
    distill: float = 0.0,
) -> LossOutput:
    """context [B, S, k*H] (target features), input_ids/loss_mask [B, S], anchors/valid
    [B, N] from sample_anchors. All blocks of the batch go through the drafter at once.
    `drafter` may be wrapped (DDP); its config is read from the unwrapped module.
    teacher [B, S, H]: the target's final (normed) hidden states; with distill > 0 the
    label of slot j is mixed with the target's distribution at anchor+j-1, the position
    whose greedy pick the label is (linear_cross_entropy)."""
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
    teacher_rows = None
    if teacher is not None and distill > 0:
        before = (positions - 1).view(batch, -1, 1).expand(-1, -1, teacher.shape[-1])
        teacher_rows = _as_autograd_input(teacher).gather(1, before).reshape(-1, teacher.shape[-1])

    weighted_ce, _ce, correct = linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), target_lm_head, labels.reshape(-1),
        weights.reshape(-1), teacher_rows, distill,
    )  # fmt: skip
    correct = correct.view(weights.shape)
    weight_sum = weights.sum()
    loss = weighted_ce / weight_sum.clamp_min(1e-6)
    hits = correct * counted
    # A round keeps the leading run of right drafts: slot j counts for a block only while
    # slots 1..j-1 were right.
    leading = hits.cumprod(dim=2)
    reached = torch.cat((torch.ones_like(leading[:, :, :1]), leading[:, :, :-1]), dim=2)
    return LossOutput(
        loss=loss,
        slot_correct=hits.sum(dim=(0, 1)),
        slot_total=counted.sum(dim=(0, 1)),
        weight_sum=weight_sum.detach(),
        run_correct=leading.sum(dim=(0, 1)),
        run_total=(reached * counted).sum(dim=(0, 1)),
    )
