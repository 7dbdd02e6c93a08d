"""Who may attend to whom in a DFlash forward: block i's queries see context positions
strictly before its anchor and every token of block i. SDPA with a dense boolean mask by
default; flex attention with a sparse block mask on request (DFLASH_ATTENTION=flex).

Why SDPA by default: on an H200 (torch 2.11) the first compiled flex_attention call of a
5-layer drafter for Qwen3-8B had not finished after 3 minutes, and the compile held the
GIL so the target threads starved too; bucketed batches change shapes, so it recompiles.
The dense mask is at most B x Q x (S+Q) booleans (8 x 8192 x 10240 = 0.7 GB at 512 anchors)
and the mem-efficient SDPA kernel takes it without compiling anything."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("auto", "flex", "sdpa")


@dataclass(frozen=True)
class AttentionLayout:
    """Exactly one of the two masks is set. Keys are [context (S) | block tokens (N*bs)]."""

    dense_mask: torch.Tensor | None  # [B, 1, Q, S+Q] bool, True = may attend
    block_mask: Any | None  # flex_attention BlockMask


class _FlexState:
    """flex_attention needs torch.compile; if that is unavailable at run time we fall back
    to SDPA once, with a warning, rather than fail the run."""

    compiled: Any = None
    broken: bool = False


def _flex_available(device: torch.device) -> bool:
    if device.type != "cuda" or _FlexState.broken:
        return False
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        _FlexState.broken = True
        return False
    return True


def dense_mask(
    anchors: torch.Tensor, valid: torch.Tensor, context_len: int, block_size: int
) -> torch.Tensor:
    batch, blocks = anchors.shape
    queries = blocks * block_size
    q_anchor = anchors.repeat_interleave(block_size, dim=1)
    q_valid = valid.repeat_interleave(block_size, dim=1)
    ctx = torch.arange(context_len, device=anchors.device)
    # Strictly before the anchor: the anchor token itself enters as block slot 0.
    sees_ctx = (ctx[None, None, :] < q_anchor[:, :, None]) & q_valid[:, :, None]
    block_of = torch.arange(queries, device=anchors.device) // block_size
    same_block = (block_of[:, None] == block_of[None, :]).expand(batch, queries, queries)
    return torch.cat((sees_ctx, same_block), dim=2)[:, None]


def _flex_block_mask(
    anchors: torch.Tensor, valid: torch.Tensor, context_len: int, block_size: int
) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    batch, blocks = anchors.shape
    queries = blocks * block_size

    def mask_mod(b: Any, _h: Any, q_idx: Any, kv_idx: Any) -> Any:
        block = q_idx // block_size
        sees_ctx = (kv_idx < context_len) & (kv_idx < anchors[b, block]) & valid[b, block]
        same_block = (kv_idx >= context_len) & ((kv_idx - context_len) // block_size == block)
        return sees_ctx | same_block

    return create_block_mask(
        mask_mod,
        batch,
        None,
        queries,
        context_len + queries,
        device=anchors.device,
        _compile=anchors.device.type == "cuda",
    )


def build_layout(
    anchors: torch.Tensor,
    valid: torch.Tensor,
    context_len: int,
    block_size: int,
    backend: str = "auto",
) -> AttentionLayout:
    if backend not in BACKENDS:
        raise ValueError(f"attention backend: {backend!r} is not one of {BACKENDS}")
    chosen = os.environ.get("DFLASH_ATTENTION", "sdpa") if backend == "auto" else backend
    want_flex = backend == "flex" or (chosen == "flex" and _flex_available(anchors.device))
    if want_flex:
        try:
            return AttentionLayout(None, _flex_block_mask(anchors, valid, context_len, block_size))
        except Exception as exc:  # a missing compiler toolchain shows up only here
            if backend == "flex":
                raise
            _FlexState.broken = True
            log.warning("flex_attention unavailable (%s); using SDPA with a dense mask", exc)
    return AttentionLayout(dense_mask(anchors, valid, context_len, block_size), None)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """q [B, Hq, Q, D], k/v [B, Hkv, K, D] (grouped-query) -> [B, Hq, Q, D]."""
    if layout.block_mask is not None:
        from torch.nn.attention.flex_attention import flex_attention

        kernel = flex_attention
        if q.is_cuda:
            # Compiled once per process; eager flex (CPU, tests) is a slow reference.
            if _FlexState.compiled is None:
                _FlexState.compiled = torch.compile(flex_attention)
            kernel = _FlexState.compiled
        return kernel(q, k, v, block_mask=layout.block_mask, scale=scale, enable_gqa=True)
    if q.is_cuda and k.shape[1] != q.shape[1]:
        # With enable_gqa and a mask, CUDA SDPA falls back to the math kernel, which
        # materialises fp32 scores for every head; repeated K/V keep the mem-efficient one.
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=layout.dense_mask, scale=scale)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=layout.dense_mask, scale=scale, enable_gqa=True
    )
