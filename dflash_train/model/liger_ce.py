"""Liger-Kernel's cross-entropy row kernel on one lm_head chunk (an optional extra: the
`liger` install extra, CUDA only). One program a row reads the logits twice (online max and
sum, argmax beside them; then softmax - onehot written over the logits in place), so a chunk
costs about two reads and one write of its bf16 logits.

The kernel is launched directly, not through `LigerCrossEntropyFunction`: that wrapper reads
the label count back to the host (two syncs a chunk) and keeps the per-row loss in the
logits' dtype; here the loss and argmax correctness land in float32 buffers and nothing
syncs. Row weights are not applied: the caller scales the [rows, hidden] products instead,
which is the same gradient for a fraction of the traffic."""

from __future__ import annotations

from functools import cache

import torch


@cache
def available() -> bool:
    """Whether the kernel can run here: liger-kernel and Triton importable, and a GPU."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
        from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel  # noqa: F401
    except ImportError:
        return False
    return True


def ce_and_grad_in_place(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-row CE, argmax == label, softmax - onehot) for logits [rows, vocab] on a GPU; the
    gradient is `logits` itself, overwritten. CE and correctness are float32."""
    import triton
    from liger_kernel.ops.cross_entropy import MAX_FUSED_SIZE, liger_cross_entropy_kernel

    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("logits: the vocab dimension must be contiguous")
    labels = labels.contiguous()
    block = min(MAX_FUSED_SIZE, triton.next_power_of_2(vocab))
    ce = torch.empty(rows, dtype=torch.float32, device=logits.device)
    correct = torch.empty(rows, dtype=torch.float32, device=logits.device)
    # reduction "sum" leaves the gradient unscaled; the unused pointers get a live tensor
    # of any type (their constexpr switches are off). 32 warps: Liger's figure for Hopper.
    liger_cross_entropy_kernel[(rows,)](
        X_ptr=logits, X_stride=logits.stride(0), Y_ptr=labels, Y_stride=1,
        weight_ptr=logits, loss_ptr=ce, z_loss_ptr=ce, loss_stride=1,
        token_accuracy_ptr=correct, token_accuracy_stride=1,
        predicted_tokens_ptr=labels, predicted_tokens_stride=0,
        n_cols=vocab, n_non_ignore=1, sum_non_ignore_weight=1, weight_sum=0.0,
        ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0, reduction="sum",
        softcap=None, RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=True,
        RETURN_PREDICTED_TOKENS=False, BLOCK_SIZE=block,
        HAS_WEIGHT=False, HAS_SOFTCAPPING=False, HAS_GRADIENTS=True, num_warps=32,
    )  # fmt: skip
    return ce, correct, logits
