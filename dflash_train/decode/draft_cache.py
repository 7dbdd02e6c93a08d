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


class DraftCache:
    """keys/values [layers, kv_heads, capacity + block_size, head_dim] of one sequence."""

    def __init__(
        self, drafter: DFlashDrafter, lm_head: nn.Module, embed: nn.Embedding, capacity: int
    ) -> None:
        c = drafter.config
        self.drafter, self.lm_head, self.embed = drafter, lm_head, embed
        self.capacity, self.size = capacity, c.block_size
        self.kv_heads, self.head_dim = c.num_kv_heads, c.head_dim
        self.group = c.num_heads // c.num_kv_heads
        weight = drafter.fc.weight
        self.dtype, self.device = weight.dtype, weight.device
        shape = (c.num_layers, c.num_kv_heads, capacity + self.size, c.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        self.columns = torch.arange(capacity + self.size, device=self.device)
        self.offsets = torch.arange(self.size, device=self.device)

    def extend(self, features: torch.Tensor, start: torch.Tensor | int) -> None:
        """Write the context keys/values of target features [n, k*H] at positions
        start..start+n-1 (columns past what a later draft may see are simply masked)."""
        d = self.drafter
        n = int(features.shape[0])
        positions = start + torch.arange(n, device=self.device)
        ctx = d.hidden_norm(d.fc(features.to(self.dtype)))  # [n, H]
        cos, sin = d.rotary(positions[None])  # [1, 1, n, head_dim]
        for index, layer in enumerate(d.layers):
            attn = layer.self_attn
            k = attn.k_norm(attn.k_proj(ctx).view(n, self.kv_heads, self.head_dim))
            k = _apply_rotary(k.transpose(0, 1)[None], cos, sin)[0]
            v = attn.v_proj(ctx).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            self.keys[index].index_copy_(1, positions, k)
            self.values[index].index_copy_(1, positions, v)

    def draft(self, anchor: torch.Tensor, anchor_pos: torch.Tensor | int) -> torch.Tensor:
        """Greedy draft tokens [block_size - 1] for slots 1.. of the block whose anchor
        token `anchor` [1] sits at `anchor_pos`."""
        head: nn.Module = self.lm_head
        hidden = self.block_hidden(anchor, anchor_pos)[1:]
        return head(hidden.to(head.weight.dtype)).argmax(dim=-1)

    def block_hidden(self, anchor: torch.Tensor, anchor_pos: torch.Tensor | int) -> torch.Tensor:
        """The drafter's final hidden states [block_size, H] for that block: it sees context
        positions strictly before the anchor and its own tokens, as in training."""
        d, size = self.drafter, self.size
        x = d.embed_blocks(self.embed, anchor.view(1, 1))[0].to(self.dtype)  # [size, H]
        block_pos = anchor_pos + self.offsets
        cos, sin = d.rotary(block_pos[None])
        block_cols = self.capacity + self.offsets
        visible = (self.columns < anchor_pos) | (self.columns >= self.capacity)
        hidden_mask = ~visible  # [C + size]
        kv, dim, group = self.kv_heads, self.head_dim, self.group
        for index, layer in enumerate(d.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).view(size, kv * group, dim))
            q = _apply_rotary(q.transpose(0, 1)[None], cos, sin)[0]  # [heads, size, dim]
            k = attn.k_norm(attn.k_proj(h).view(size, kv, dim))
            k = _apply_rotary(k.transpose(0, 1)[None], cos, sin)[0]
            v = attn.v_proj(h).view(size, kv, dim).transpose(0, 1)
            self.keys[index].index_copy_(1, block_cols, k)
            self.values[index].index_copy_(1, block_cols, v)
            # Query head h uses kv head h // group: [kv, group*size, dim] x [kv, dim, C].
            grouped = q.reshape(kv, group * size, dim)
            scores = (grouped @ self.keys[index].transpose(-1, -2)).float() * dim**-0.5
            weights = scores.masked_fill(hidden_mask, float("-inf")).softmax(dim=-1)
            out = weights.to(v.dtype) @ self.values[index]  # [kv, group*size, dim]
            out = out.view(kv * group, size, dim).transpose(0, 1).reshape(size, -1)
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
        """One decode round's drafter work: the last verify's features [block_size, k*H]
        (at start..) join the cache, then the next block is drafted."""
        self.extend(features, start)
        return self.draft(anchor, anchor_pos)


class GraphedRound:
    """DraftCache.round captured as one CUDA graph (a round is a few hundred small
    kernels; launching them from Python cost more than running them)."""

    def __init__(self, cache: DraftCache, feature_size: int) -> None:
        device = cache.device
        self.cache = cache
        self.features = torch.zeros(cache.size, feature_size, dtype=cache.dtype, device=device)
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
        self.features.copy_(features)
        self.start.fill_(start)
        self.anchor.copy_(anchor.view(1))
        self.anchor_pos.fill_(anchor_pos)
        self.graph.replay()
        return self.out.clone()


class CachedDrafter:
    """What speculative decoding calls: `begin` with the prompt's features, then `round`
    after each verify. On CUDA the round is a graph replay; elsewhere it runs eagerly."""

    def __init__(
        self,
        drafter: DFlashDrafter,
        lm_head: nn.Module,
        embed: nn.Embedding,
        capacity: int,
        feature_size: int,
        graphs: bool | None = None,
    ) -> None:
        self.cache = DraftCache(drafter, lm_head, embed, capacity)
        self.graph: GraphedRound | None = None
        use = self.cache.device.type == "cuda" if graphs is None else graphs
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
        self.cache.extend(features, 0)
        return self.cache.draft(anchor, int(features.shape[0]))

    def round(
        self, features: torch.Tensor, start: int, anchor: torch.Tensor, anchor_pos: int
    ) -> torch.Tensor:
        if self.graph is not None:
            return self.graph(features, start, anchor, anchor_pos)
        return self.cache.round(features, start, anchor, anchor_pos)
