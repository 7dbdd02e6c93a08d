"""The target's forward over a preallocated KV cache, for batched generation and for
speculative decoding: no per-step cache objects, no `generate()` loop, and "cutting the cache
back" to an accepted prefix is only a smaller start position for the next write.

It drives the HF model's own modules (embedding, norms, projections, MLPs, rotary embedding,
lm_head) and replaces only the attention's cache handling, so any Llama- or Qwen3-family
decoder (q/k norms used when present) runs through it; `supports(target)` says whether one
does. Rows of a batch are left-padded: every row writes the same cache column at each step,
and `key_valid` hides each row's padding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from dflash_train.targets.frozen_target import Target

T = TypeVar("T")


def supports(target: Target) -> bool:
    """A decoder of self-attention layers with q/k/v/o projections (not a hybrid of
    linear-attention layers, whose recurrent state cannot be cut back)."""
    layers = target.layers
    return all(
        hasattr(layer, "self_attn") and hasattr(layer.self_attn, "q_proj") for layer in layers
    ) and hasattr(target.backbone, "rotary_emb")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


@dataclass
class KVCache:
    """keys/values [layers, batch, kv_heads, capacity, head_dim]; key_valid [batch, capacity]
    is False on each row's left padding."""

    keys: torch.Tensor
    values: torch.Tensor
    key_valid: torch.Tensor

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[3])

    def row(self, index: int) -> KVCache:
        """Row `index` alone, as views: a forward on it writes into this cache."""
        part = slice(index, index + 1)
        return KVCache(self.keys[:, part], self.values[:, part], self.key_valid[part])

    def keep_rows(self, rows: torch.Tensor) -> KVCache:
        """A cache of only `rows` (index tensor): finished sequences stop costing attention."""
        return KVCache(
            self.keys.index_select(1, rows),
            self.values.index_select(1, rows),
            self.key_valid.index_select(0, rows),
        )


@dataclass(frozen=True)
class StepOutput:
    logits: torch.Tensor  # [B, n, vocab] (or [B, 1, vocab] when only the last was asked for)
    context: torch.Tensor | None  # [B, n, k*H] hidden states of the requested layers


class CachedTarget:
    """Forward passes of `target` that read and extend a KVCache."""

    def __init__(self, target: Target) -> None:
        if not supports(target):
            raise ValueError(f"target {target.spec}: its layers are not plain self-attention")
        self.target = target
        attn = target.layers[0].self_attn
        config = target.model.config
        config = getattr(config, "text_config", None) or config
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(attn.q_proj.weight.shape[0]) // self.num_heads
        self.scale = float(getattr(attn, "scaling", self.head_dim**-0.5))

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.embed_tokens.weight.dtype

    def cache_bytes_per_position(self) -> int:
        """KV-cache bytes one row's one position takes (keys and values, every layer)."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * len(self.target.layers) * self.num_kv_heads * self.head_dim * element

    def new_cache(self, batch: int, capacity: int, pad: Sequence[int] | None = None) -> KVCache:
        shape = (len(self.target.layers), batch, self.num_kv_heads, capacity, self.head_dim)
        keys = torch.zeros(shape, device=self.device, dtype=self.dtype)
        valid = torch.ones(batch, capacity, dtype=torch.bool, device=self.device)
        if pad is not None:
            columns = torch.arange(capacity, device=self.device)
            lefts = torch.tensor(list(pad), device=self.device)
            valid = columns[None, :] >= lefts[:, None]
        return KVCache(keys, torch.zeros_like(keys), valid)

    @torch.inference_mode()
    def forward(
        self,
        cache: KVCache,
        input_ids: torch.Tensor,
        start: int,
        *,
        pad: torch.Tensor | None = None,
        layer_ids: Sequence[int] = (),
        all_logits: bool = False,
    ) -> StepOutput:
        """Run `input_ids` [B, n] at cache columns start..start+n-1, attending to every valid
        column before and up to each query. `pad` [B] (left-padding per row) shifts the
        rotary positions so each row's first real token is at position 0. Columns at or after
        `start` hold nothing the queries can see, whatever an earlier call left there."""
        batch, n = input_ids.shape
        end = start + n
        if end > cache.capacity:
            raise ValueError(f"cache: {end} columns needed, capacity {cache.capacity}")
        target = self.target
        device = input_ids.device
        columns = torch.arange(start, end, device=device)
        positions = columns[None, :].expand(batch, n)
        if pad is not None:
            positions = (positions - pad[:, None]).clamp_min(0)
        hidden = target.embed_tokens(input_ids)
        cos, sin = target.backbone.rotary_emb(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]
        keys_seen = torch.arange(end, device=device)
        causal = keys_seen[None, :] <= columns[:, None]  # [n, end]
        # A padded query still sees itself, so its (unused) output is finite rather than NaN.
        mask = (cache.key_valid[:, None, :end] & causal[None]) | (
            keys_seen[None, None, :] == columns[None, :, None]
        )
        mask = mask[:, None]  # [B, 1, n, end]
        wanted = set(layer_ids)
        captured: dict[int, torch.Tensor] = {}
        last = len(target.layers) - 1
        for index, layer in enumerate(target.layers):
            residual = hidden
            h = layer.input_layernorm(hidden)
            hidden = residual + self._attention(
                layer.self_attn, h, cache, index, start, cos, sin, mask
            )
            residual = hidden
            hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
            if index in wanted and index != last:
                captured[index] = hidden
        normed = target.backbone.norm(hidden)
        if last in wanted:
            captured[last] = normed  # hidden_states[L] is taken after the final norm
        head_input = normed if all_logits else normed[:, -1:]
        logits = target.lm_head(head_input)
        context = torch.cat([captured[i] for i in layer_ids], dim=-1) if layer_ids else None
        return StepOutput(logits, context)

    def _attention(
        self,
        attn: torch.nn.Module,
        h: torch.Tensor,
        cache: KVCache,
        layer: int,
        start: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        batch, n, _ = h.shape
        q = attn.q_proj(h).view(batch, n, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(batch, n, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(h).view(batch, n, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        end = start + n
        cache.keys[layer, :, :, start:end] = k
        cache.values[layer, :, :, start:end] = v
        out = F.scaled_dot_product_attention(
            q,
            cache.keys[layer, :, :, :end],
            cache.values[layer, :, :, :end],
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        return attn.o_proj(out.transpose(1, 2).reshape(batch, n, -1))


def static_forward(
    runner: CachedTarget,
    cache: KVCache,
    input_ids: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    layer_ids: Sequence[int] = (),
    limit: int | None = None,
) -> StepOutput:
    """CachedTarget.forward with every shape fixed, for CUDA-graph capture: `start` (one
    column for every row, 0-dim, or one per row, [B]) and `pad` [B] are device tensors, the
    write goes through scatter_ (each row at its own columns), and attention covers
    the first `limit` cache columns (all of them by default; every query must sit before
    it) with the columns after each query (and each row's padding) masked. The GQA
    attention multiplies each key/value head with its group of query heads directly, so
    keys and values are read once instead of being repeated per query head."""
    target = runner.target
    batch, n = input_ids.shape
    device = input_ids.device
    heads, kv_heads, dim = runner.num_heads, runner.num_kv_heads, runner.head_dim
    group = heads // kv_heads
    columns = (start.view(-1, 1) + torch.arange(n, device=device)).expand(batch, n)  # [B, n]
    positions = (columns - pad[:, None]).clamp_min(0)
    hidden = target.embed_tokens(input_ids)
    cos, sin = target.backbone.rotary_emb(hidden, positions)
    cos, sin = cos[:, None], sin[:, None]
    seen = cache.capacity if limit is None else limit
    keys_seen = torch.arange(seen, device=device)
    valid = cache.key_valid[:, None, :seen]
    visible = valid & (keys_seen[None, None, :] <= columns[:, :, None])
    visible = visible | (keys_seen[None, None, :] == columns[:, :, None])  # [B, n, C]
    write_at = columns[:, None, :, None].expand(batch, kv_heads, n, dim)
    hidden_mask = ~visible[:, None, None].expand(batch, 1, group, n, seen)
    hidden_mask = hidden_mask.reshape(batch, 1, group * n, seen)
    captured: dict[int, torch.Tensor] = {}
    last = len(target.layers) - 1
    for index, layer in enumerate(target.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(hidden)
        q = attn.q_proj(h).view(batch, n, heads, dim)
        k = attn.k_proj(h).view(batch, n, kv_heads, dim)
        v = attn.v_proj(h).view(batch, n, kv_heads, dim)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        cache.keys[index].scatter_(2, write_at, k)
        cache.values[index].scatter_(2, write_at, v)
        # [B, kv, group*n, d] x [B, kv, d, C]: query head h uses kv head h // group.
        grouped = q.reshape(batch, kv_heads, group * n, dim)
        keys, values = cache.keys[index, :, :, :seen], cache.values[index, :, :, :seen]
        scores = (grouped @ keys.transpose(-1, -2)).float() * runner.scale
        weights = scores.masked_fill(hidden_mask, float("-inf")).softmax(dim=-1)
        out = weights.to(v.dtype) @ values  # [B, kv, group*n, d]
        out = out.view(batch, heads, n, dim).transpose(1, 2).reshape(batch, n, -1)
        hidden = hidden + attn.o_proj(out)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        if index in layer_ids and index != last:
            captured[index] = hidden
    normed = target.backbone.norm(hidden)
    if last in layer_ids:
        captured[last] = normed
    context = torch.cat([captured[i] for i in layer_ids], dim=-1) if layer_ids else None
    return StepOutput(target.lm_head(normed), context)


def capture_graph(run: Callable[[], T], device: torch.device) -> tuple[torch.cuda.CUDAGraph, T]:
    """`run` captured as a CUDA graph, after two warm-up calls on a side stream (allocator,
    lazy inits); returns the graph and the outputs each replay rewrites."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    # thread_local: only this thread's calls are checked during the capture. Inside the
    # trainer other threads pin host memory (the loader, the checkpoint write), which the
    # default (global) mode forbids while any stream captures, failing both sides.
    with torch.inference_mode(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = run()
    return graph, out


class StaticStep:
    """Forwards of a fixed width `n` for every row of `cache` at any start column (before
    `limit`, the attention columns covered), through static_forward: the shapes a CUDA
    graph captures, run as they are (GraphedStep captures them)."""

    def __init__(
        self,
        runner: CachedTarget,
        cache: KVCache,
        n: int,
        layer_ids: Sequence[int],
        pad: torch.Tensor | None = None,
        limit: int | None = None,
    ) -> None:
        self.runner, self.cache, self.n, self.layer_ids = runner, cache, n, tuple(layer_ids)
        self.limit = cache.capacity if limit is None else min(limit, cache.capacity)
        device = runner.device
        batch = int(cache.keys.shape[1])
        self.ids = torch.zeros(batch, n, dtype=torch.long, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.pad = torch.zeros(batch, dtype=torch.long, device=device)
        if pad is not None:
            self.pad.copy_(pad)
        self._prepare()

    def _prepare(self) -> None:
        """Called once the buffers exist (GraphedStep captures its graph here)."""

    def _run(self) -> StepOutput:
        return static_forward(
            self.runner, self.cache, self.ids, self.start, self.pad, self.layer_ids, self.limit
        )

    def _replay(self) -> StepOutput:
        return self._run()

    def __call__(self, input_ids: torch.Tensor, start: int) -> StepOutput:
        if start + self.n > self.limit:
            raise ValueError(f"cache: {start + self.n} columns needed, limit {self.limit}")
        self.ids.copy_(input_ids.view(self.ids.shape))
        self.start.fill_(start)
        out = self._replay()
        context = None if out.context is None else out.context.clone()
        return StepOutput(out.logits.clone(), context)


class GraphedStep(StaticStep):
    """StaticStep captured once as a CUDA graph: a decode step is ~1,300 small kernels, and
    launching them one by one from Python costs far more than running them."""

    def _prepare(self) -> None:
        # Warm-up at the last columns it covers: whatever it writes there is rewritten
        # before any query can see it.
        self.start.fill_(self.limit - self.n)
        self.graph, self.out = capture_graph(self._run, self.runner.device)

    def _replay(self) -> StepOutput:
        self.graph.replay()
        return self.out
