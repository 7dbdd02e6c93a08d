"""The drafter at decode time: the keys and values of its context, per layer, kept in a
cache, so a round projects only the positions the last verify added instead of the whole
context again; every shape is fixed, so on CUDA a round replays one captured graph.

The context's keys and values depend on nothing but the target features at that position
(`hidden_norm(fc(features))` goes into every layer's k/v projections unchanged), so caching
them gives the drafter's own forward exactly: the same projections, norms and rotary
positions, only computed once per position. Cache columns are positions; the block's own
keys and values sit in `block_size` extra columns at the end."""

from __future__ import annotations

import logging

import torch
from torch import nn

from dflash_train.decode.cached_target import capture_graph
from dflash_train.model.drafter import DFlashDrafter, _apply_rotary

log = logging.getLogger(__name__)


def _per_row(value: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    """A position as a [rows, 1] column: one per row ([B] tensor) or shared (int, 0-dim)."""
    if isinstance(value, torch.Tensor):
        return value.view(-1, 1)
    return torch.full((1, 1), int(value), dtype=torch.long, device=device)


class DraftCache:
    """keys/values [layers, batch, kv_heads, capacity + block_size, head_dim]: `batch`
    sequences, each at its own positions (the in-run evaluation decodes its prompts as one
    batch; `dflash-train eval` one at a time, batch 1)."""

    def __init__(
        self,
        drafter: DFlashDrafter,
        lm_head: nn.Module,
        embed: nn.Embedding,
        capacity: int,
        batch: int = 1,
    ) -> None:
        c = drafter.config
        self.drafter, self.lm_head, self.embed = drafter, lm_head, embed
        self.capacity, self.size, self.batch = capacity, c.block_size, batch
        self.kv_heads, self.head_dim = c.num_kv_heads, c.head_dim
        self.group = c.num_heads // c.num_kv_heads
        weight = drafter.fc.weight
        self.dtype, self.device = weight.dtype, weight.device
        shape = (c.num_layers, batch, c.num_kv_heads, capacity + self.size, c.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        self.columns = torch.arange(capacity + self.size, device=self.device)
        self.offsets = torch.arange(self.size, device=self.device)

    def _write(self, layer: int, columns: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [B, kv_heads, n, head_dim] into each row's `columns` [B, n]."""
        index = columns[:, None, :, None].expand(-1, self.kv_heads, -1, self.head_dim)
        self.keys[layer].scatter_(2, index, k)
        self.values[layer].scatter_(2, index, v)

    def extend(self, features: torch.Tensor, start: torch.Tensor | int) -> None:
        """Write the context keys/values of target features [B, n, k*H] at positions
        start..start+n-1 of each row (`start`: one per row, or shared); columns past what a
        later draft may see are simply masked."""
        d = self.drafter
        batch, n = int(features.shape[0]), int(features.shape[1])
        offsets = torch.arange(n, device=self.device)
        positions = (_per_row(start, self.device) + offsets).expand(batch, n)
        ctx = d.hidden_norm(d.fc(features.to(self.dtype)))  # [B, n, H]
        cos, sin = d.rotary(positions)  # [B, 1, n, head_dim]
        for index, layer in enumerate(d.layers):
            attn = layer.self_attn
            k = attn.k_norm(attn.k_proj(ctx).view(batch, n, self.kv_heads, self.head_dim))
            k = _apply_rotary(k.transpose(1, 2), cos, sin)
            v = attn.v_proj(ctx).view(batch, n, self.kv_heads, self.head_dim).transpose(1, 2)
            self._write(index, positions, k, v)

    def draft(self, anchor: torch.Tensor, anchor_pos: torch.Tensor | int) -> torch.Tensor:
        """Greedy draft tokens [B, block_size - 1] for slots 1.. of each row's block whose
        anchor token `anchor` [B] sits at `anchor_pos`."""
        head: nn.Module = self.lm_head
        hidden = self.block_hidden(anchor, anchor_pos)[:, 1:]
        return head(hidden.to(head.weight.dtype)).argmax(dim=-1)

    def block_hidden(self, anchor: torch.Tensor, anchor_pos: torch.Tensor | int) -> torch.Tensor:
        """The drafter's final hidden states [B, block_size, H] for each row's block: it
        sees context positions strictly before its anchor and its own tokens, as in
        training."""
        d, size, batch = self.drafter, self.size, self.batch
        x = d.embed_blocks(self.embed, anchor.view(batch, 1)).to(self.dtype)  # [B, size, H]
        at = _per_row(anchor_pos, self.device)
        cos, sin = d.rotary((at + self.offsets).expand(batch, size))
        block_cols = (self.capacity + self.offsets).expand(batch, size)
        visible = (self.columns < at) | (self.columns >= self.capacity)  # [B or 1, C + size]
        hidden_mask = ~visible[:, None, None, :]
        kv, dim, group = self.kv_heads, self.head_dim, self.group
        for index, layer in enumerate(d.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).view(batch, size, kv * group, dim))
            q = _apply_rotary(q.transpose(1, 2), cos, sin)  # [B, heads, size, dim]
            k = attn.k_norm(attn.k_proj(h).view(batch, size, kv, dim))
            k = _apply_rotary(k.transpose(1, 2), cos, sin)
            v = attn.v_proj(h).view(batch, size, kv, dim).transpose(1, 2)
            self._write(index, block_cols, k, v)
            # Query head h uses kv head h // group: [B, kv, group*size, dim] x [B, kv, dim, C].
            grouped = q.reshape(batch, kv, group * size, dim)
            scores = (grouped @ self.keys[index].transpose(-1, -2)).float() * dim**-0.5
            weights = scores.masked_fill(hidden_mask, float("-inf")).softmax(dim=-1)
            out = weights.to(v.dtype) @ self.values[index]  # [B, kv, group*size, dim]
            out = out.view(batch, kv * group, size, dim).transpose(1, 2).reshape(batch, size, -1)
            x = x + attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return d.norm(x)

    def round(
        self,
        features: torch.Tensor,
        start: torch.Tensor | int,
        anchor: torch.Tensor,
        anchor_pos: torch.Tensor | int,
    ) -> torch.Tensor:
        """One decode round's drafter work: the last verify's features [B, block_size, k*H]
        (at start..) join the cache, then the next block is drafted."""
        self.extend(features, start)
        return self.draft(anchor, anchor_pos)


class GraphedRound:
    """DraftCache.round captured as one CUDA graph (a round is a few hundred small
    kernels; launching them from Python cost more than running them)."""

    def __init__(self, cache: DraftCache, feature_size: int) -> None:
        device = cache.device
        self.cache = cache
        shape = (cache.batch, cache.size, feature_size)
        self.features = torch.zeros(shape, dtype=cache.dtype, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.anchor = torch.zeros(1, dtype=torch.long, device=device)
        self.anchor_pos = torch.zeros((), dtype=torch.long, device=device)
        # Warm-up at the last columns (masked for any real draft).
        self.start.fill_(cache.capacity - cache.size)
        self.anchor_pos.fill_(cache.capacity - cache.size)
        self.graph, self.out = capture_graph(self._run, device)

    def _run(self) -> torch.Tensor:
        return self.cache.round(self.features, self.start, self.anchor, self.anchor_pos)

    def __call__(
        self, features: torch.Tensor, start: int, anchor: torch.Tensor, anchor_pos: int
    ) -> torch.Tensor:
        self.features.copy_(features.view(self.features.shape))
        self.start.fill_(start)
        self.anchor.copy_(anchor.view(1))
        self.anchor_pos.fill_(anchor_pos)
        self.graph.replay()
        return self.out[0].clone()


class CachedDrafter:
    """What speculative decoding calls: `begin` with the prompt's features, then `round`
    after each verify, one sequence (batch 1) unless `batch` says otherwise (then only its
    cache is used, by a DeviceRound). On CUDA the round is a graph replay; elsewhere it
    runs eagerly."""

    def __init__(
        self,
        drafter: DFlashDrafter,
        lm_head: nn.Module,
        embed: nn.Embedding,
        capacity: int,
        feature_size: int,
        graphs: bool | None = None,
        batch: int = 1,
    ) -> None:
        self.cache = DraftCache(drafter, lm_head, embed, capacity, batch)
        self.graph: GraphedRound | None = None
        use = self.cache.device.type == "cuda" if graphs is None else graphs
        use = use and batch == 1
        if use:
            try:
                self.graph = GraphedRound(self.cache, feature_size)
            except (RuntimeError, torch.cuda.CudaError) as exc:  # fall back, slower
                log.warning("drafter CUDA graph unavailable (%s); drafting eagerly", exc)

    @property
    def block_size(self) -> int:
        return self.cache.size

    def begin(self, features: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """The prompt's features [P, k*H] (positions 0..P-1) and the first anchor (at P):
        the first block's drafts."""
        self.cache.extend(features[None], 0)
        return self.cache.draft(anchor, int(features.shape[0]))[0]

    def round(
        self, features: torch.Tensor, start: int, anchor: torch.Tensor, anchor_pos: int
    ) -> torch.Tensor:
        if self.graph is not None:
            return self.graph(features, start, anchor, anchor_pos)
        return self.cache.round(features[None], start, anchor, anchor_pos)[0]
