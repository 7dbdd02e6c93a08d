"""Who may attend to whom in a DFlash forward: block i's queries see context positions
strictly before its anchor and every token of block i.

Two implementations of that one rule:
- "flex" (default on CUDA): torch's flex_attention with a block-sparse BlockMask built
  directly from the anchors (no dense mask, no compiled create_block_mask). Only the
  128x128 tiles that hold an allowed pair are visited, about 1/8 of the dense pairs at
  512 anchors x block 16 over 2048 tokens. Context and queries are padded to multiples of
  PAD_TO, and the kernel is compiled with dynamo's automatic dynamic shapes: the first
  shape gets a static graph, the first shape that differs from it a graph whose rows and
  lengths are symbolic (rows >= 2; dynamo always specialises a size of 1, so single-row
  batches get one graph of their own). The trainer runs the few shapes that make those
  graphs on the main thread before any worker thread starts (compile_warm_up.py): a
  compile inside a worker holding the GIL once hung a launch, and one compile per new
  (rows, length) pair cost 1.3-2.7 s each mid-run on an H200.
- "sdpa" (the reference, and the CPU path): SDPA with a dense boolean [B,1,Q,S+Q] mask.

The trainer's `attention` option (or DFLASH_ATTENTION, read by the config loader) picks
one; "auto" is flex where the device runs it, else sdpa."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from dflash_train.model.compile_watch import watching
from dflash_train.model.dynamo_limits import allow_recompiles

log = logging.getLogger(__name__)

BACKENDS = ("auto", "flex", "sdpa")
TILE = 128  # flex_attention's sparse block size
# Context and query lengths are padded to multiples of this on the flex path: fewer shapes
# to compile, and block-diagonal tiles that line up with the 128-tiles.
PAD_TO = 256
# Padded lengths are multiples of PAD_TO (and of every Triton tile size flex uses), which
# inductor can only prove for static lengths: said here, the kernels of the dynamic graph
# skip the bounds checks, as the static ones do.
KERNEL_OPTIONS = {"IS_DIVISIBLE": True}
# Past head_dim 128 (Qwen3.6-27B's drafter: 256) torch's sm90 backward default is 64x64 tiles
# on 4 warps; 8 warps took 27 % less time on the trainer's own mask, with bit-identical
# output and gradients (bench/flex_tiles.py on an H100, 2026-12-05: 19.3 against 26.4 ms a
# layer). At 128 the default already does as well (12.85 against 12.86 ms).
WIDE_HEAD_KERNEL_OPTIONS = {**KERNEL_OPTIONS, "bwd_num_warps": 8}


def kernel_options(head_dim: int) -> dict[str, Any]:
    """The compiled flex kernels' options for this head size."""
    return WIDE_HEAD_KERNEL_OPTIONS if head_dim > 128 else KERNEL_OPTIONS


@dataclass(frozen=True)
class AttentionLayout:
    """Exactly one of the two masks is set. Keys are [context (S) | block tokens (Q)]; the
    flex path pads them to [context (padded_context) | block tokens (padded_queries)]."""

    dense_mask: torch.Tensor | None  # [B, 1, Q, S+Q] bool, True = may attend
    block_mask: Any | None  # flex_attention BlockMask over the padded shapes
    context_len: int = 0
    queries: int = 0
    padded_context: int = 0
    padded_queries: int = 0


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _FlexState:
    """The compiled kernel (per compiler backend) and whether flex works."""

    lock = threading.Lock()
    compiled: dict[Any, Any] = {}  # noqa: RUF012  (per backend; process-wide by design)
    broken: bool = False
    # CPU tensors take eager flex (the slow reference) unless this is a torch.compile
    # backend: the tests run the compiled path's graph capture on the CPU with "aot_eager"
    # (inductor's CPU flex kernel has no backward).
    cpu_backend: Any = None
    # torch.compile's `dynamic`: None is automatic dynamic shapes; False (one static graph
    # per shape, the old behaviour) once inductor has failed to compile a dynamic graph.
    dynamic: bool | None = None
    # torch.compile's `mode` for inductor: None, or "max-autotune-no-cudagraphs", which
    # times flex's tile configurations (forward and backward) on the GPU at the first
    # compile of each graph instead of taking the defaults for the head size.
    mode: str | None = None


def flex_usable(device: torch.device) -> bool:
    if device.type != "cuda" or _FlexState.broken:
        return False
    try:
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError:
        _FlexState.broken = True
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """'flex' or 'sdpa' for a drafter on `device` (what run_start reports)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend: {backend!r} is not one of {BACKENDS}")
    if backend != "auto":
        return backend
    return "flex" if flex_usable(device) else "sdpa"


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


def _tile_flags(
    limit: torch.Tensor, context: int, queries: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) [B, q_tiles, kv_tiles] bool over the padded shapes. `limit` [B, Q]
    is each query's context bound (it sees context keys < limit). A full tile is one every
    query of the Q-tile sees whole (no mask_mod needed); a partial one holds some pair."""
    batch = limit.shape[0]
    device = limit.device
    keys = context + queries
    q_tiles, kv_tiles = -(-queries // TILE), -(-keys // TILE)
    pad = q_tiles * TILE - queries
    hi = F.pad(limit, (0, pad), value=0).view(batch, q_tiles, TILE).amax(-1)
    lo = F.pad(limit, (0, pad), value=keys).view(batch, q_tiles, TILE).amin(-1)
    j = torch.arange(kv_tiles, device=device)
    full = (j + 1) * TILE <= lo[..., None]  # lo <= an anchor < context: context tiles only
    sees_context = j * TILE < hi[..., None]
    t = torch.arange(q_tiles, device=device)
    first_block = t * TILE // block_size
    last_block = ((t + 1) * TILE).clamp(max=queries) - 1
    last_block = last_block // block_size
    first_key = context + first_block * block_size
    last_key = (context + (last_block + 1) * block_size - 1).clamp(max=keys - 1)
    own = (j >= (first_key // TILE)[:, None]) & (j <= (last_key // TILE)[:, None])
    partial = (sees_context | own) & ~full
    return partial, full


def _pack(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, q_tiles, kv_tiles] bool -> (counts [B,1,q_tiles], indices [B,1,q_tiles,kv_tiles])
    int32, the listed tiles first in key order."""
    counts = flags.sum(-1, dtype=torch.int32)
    order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None].contiguous(), order[:, None].contiguous()


def flex_layout(
    anchors: torch.Tensor, valid: torch.Tensor, context_len: int, block_size: int
) -> AttentionLayout:
    """A BlockMask for the padded shapes, from the anchors alone (a few small tensor ops on
    the device, no host sync, nothing compiled)."""
    from torch.nn.attention.flex_attention import BlockMask

    blocks = anchors.shape[1]
    queries = blocks * block_size
    context = _round_up(context_len, PAD_TO)
    padded_q = _round_up(queries, PAD_TO)
    padded_blocks = -(-padded_q // block_size)
    device = anchors.device
    limit = torch.where(valid, anchors, torch.zeros_like(anchors))
    limit = F.pad(limit, (0, padded_blocks - blocks), value=0)  # padded blocks see no context
    # Key -> block it belongs to (-1 for context keys); padded context keys sit at
    # positions >= context_len > every anchor, so no query sees them.
    key_block = torch.cat(
        (
            torch.full((context,), -1, device=device, dtype=torch.long),
            torch.arange(padded_q, device=device) // block_size,
        )
    )

    def mask_mod(b: Any, _h: Any, q_idx: Any, kv_idx: Any) -> Any:
        block = q_idx // block_size
        return (kv_idx < limit[b, block]) | (key_block[kv_idx] == block)

    q_limit = limit.repeat_interleave(block_size, dim=1)[:, :padded_q]
    partial, full = _tile_flags(q_limit, context, padded_q, block_size)
    kv_num, kv_idx = _pack(partial)
    full_num, full_idx = _pack(full)
    block_mask = BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=TILE,
        mask_mod=mask_mod,
        seq_lengths=(padded_q, context + padded_q),
    )
    return AttentionLayout(None, block_mask, context_len, queries, context, padded_q)


def build_layout(
    anchors: torch.Tensor,
    valid: torch.Tensor,
    context_len: int,
    block_size: int,
    backend: str = "auto",
) -> AttentionLayout:
    if resolve_backend(backend, anchors.device) == "flex":
        return flex_layout(anchors, valid, context_len, block_size)
    return AttentionLayout(
        dense_mask(anchors, valid, context_len, block_size),
        None,
        context_len,
        anchors.shape[1] * block_size,
    )


def _pad_keys(t: torch.Tensor, layout: AttentionLayout) -> torch.Tensor:
    """[context | blocks] -> [context, zeros | blocks, zeros] at the padded lengths."""
    s, sp = layout.context_len, layout.padded_context
    q, qp = layout.queries, layout.padded_queries
    if sp == s and qp == q:
        return t
    b, h, _, d = t.shape
    parts = [t[:, :, :s]]
    if sp > s:
        parts.append(t.new_zeros(b, h, sp - s, d))
    parts.append(t[:, :, s:])
    if qp > q:
        parts.append(t.new_zeros(b, h, qp - q, d))
    return torch.cat(parts, dim=2)


def _compiled_flex(backend: Any) -> Any:
    with _FlexState.lock:
        if backend not in _FlexState.compiled:
            from torch.nn.attention.flex_attention import flex_attention

            allow_recompiles()
            # dynamic=None: automatic dynamic shapes (see the module docstring). Marking the
            # dims dynamic up front cannot work: the BlockMask's lengths are Python ints,
            # which dynamo makes symbolic only once it has seen them change.
            mode = _FlexState.mode if backend == "inductor" else None
            _FlexState.compiled[backend] = torch.compile(
                flex_attention,
                backend=backend,
                dynamic=_FlexState.dynamic,
                fullgraph=True,
                mode=mode,
            )
        return _FlexState.compiled[backend]


def compiles_flex(device: torch.device) -> bool:
    """Whether flex calls on `device` run the compiled kernel (CUDA; the CPU in tests)."""
    return device.type == "cuda" or _FlexState.cpu_backend is not None


def set_flex_autotune(on: bool) -> None:
    """Autotune flex's kernels from the next compile on (bench/profile_drafter.py
    --flex-autotune measures it against the defaults: flex's share of a 27B-dims step is
    18.5 %, its backward at head_dim 256 the largest part)."""
    with _FlexState.lock:
        _FlexState.mode = "max-autotune-no-cudagraphs" if on else None
        _FlexState.compiled.clear()


def flex_compile_mode() -> str | None:
    return _FlexState.mode


def compile_static_shapes() -> None:
    """Compile one static graph per shape from now on: the fallback for a dynamic graph
    that inductor cannot compile."""
    with _FlexState.lock:
        _FlexState.dynamic = False
        _FlexState.compiled.clear()


def _flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    qp = layout.padded_queries
    if qp > q.shape[2]:
        q = F.pad(q, (0, 0, 0, qp - q.shape[2]))
    k, v = _pad_keys(k, layout), _pad_keys(v, layout)
    backend = "inductor" if q.is_cuda else _FlexState.cpu_backend
    if not compiles_flex(q.device):  # eager flex: a slow reference (tests)
        out = flex_attention(q, k, v, block_mask=layout.block_mask, scale=scale, enable_gqa=True)
        return out[:, :, : layout.queries]
    kernel = _compiled_flex(backend)
    with watching("drafter_attention", "drafter attention", tuple(q.shape)):
        out = kernel(
            q, k, v, block_mask=layout.block_mask, scale=scale, enable_gqa=True,
            kernel_options=kernel_options(q.shape[-1]),
        )  # fmt: skip
    return out[:, :, : layout.queries]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, scale: float
) -> torch.Tensor:
    """q [B, Hq, Q, D], k/v [B, Hkv, K, D] (grouped-query) -> [B, Hq, Q, D]."""
    if layout.block_mask is not None:
        return _flex(q, k, v, layout, scale)
    if q.is_cuda and k.shape[1] != q.shape[1]:
        # With enable_gqa and a mask, CUDA SDPA falls back to the math kernel, which
        # materialises fp32 scores for every head; repeated K/V keep the mem-efficient one.
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=layout.dense_mask, scale=scale)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=layout.dense_mask, scale=scale, enable_gqa=True
    )
