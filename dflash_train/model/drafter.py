"""The DFlash drafter: a small Qwen3-style decoder whose keys and values are the projected
target context followed by the block tokens (docs/architecture.md), plus its config and its
files."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dflash_train.model.attention_layout import AttentionLayout, attend, build_layout

if TYPE_CHECKING:
    from dflash_train.model.mask_token import MaskChoice

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"
MASK_MODES = ("token", "learned")
Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [B, 1, P, head_dim]


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    # "token": block slots 1.. hold the target's embedding of mask_token_id (mask_token.py
    # says which id); "learned": the drafter's own `mask_embedding` vector, only on request
    # (--mask-token learned): no inference engine loads it.
    mask_token_id: int | None
    mask_mode: str
    max_position: int
    vocab_size: int

    def __post_init__(self) -> None:
        if self.mask_mode not in MASK_MODES:
            raise ValueError(f"mask_mode: {self.mask_mode!r} is not one of {MASK_MODES}")
        if self.mask_mode == "token" and self.mask_token_id is None:
            raise ValueError("mask_token_id: required when mask_mode is 'token'")
        if self.block_size < 2:
            raise ValueError(f"block_size: must be at least 2, got {self.block_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads: {self.num_kv_heads} does not divide num_heads={self.num_heads}"
            )
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids: must name at least one target layer")

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["target_layer_ids"] = list(self.target_layer_ids)
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DFlashConfig:
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in record]
        if missing:
            raise ValueError(f"drafter config: missing field {missing[0]!r}")
        values = {n: record[n] for n in names}
        values["target_layer_ids"] = tuple(int(i) for i in values["target_layer_ids"])
        return cls(**values)


def drafter_config_for_target(
    target: Any,
    *,
    num_layers: int,
    block_size: int = 16,
    num_context_layers: int | None = None,
    mask: MaskChoice | None = None,
) -> DFlashConfig:
    """A drafter shaped like the target's attention (hidden size, heads, head_dim, MLP), fed
    by `num_context_layers` target layers (the reference uses as many as draft layers).
    `mask`: the trainer's choice (mask_token.py, checked against the data); without one,
    the same rule unchecked against any data."""
    from dflash_train.model.mask_token import choose_mask
    from dflash_train.targets.frozen_target import target_layer_ids

    cfg = target.model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    mask = mask or choose_mask(target.tokenizer, target.vocab_size, None)
    return DFlashConfig(
        hidden_size=int(cfg.hidden_size),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        intermediate_size=int(cfg.intermediate_size),
        rms_norm_eps=float(cfg.rms_norm_eps),
        rope_theta=float(rope.get("rope_theta", getattr(cfg, "rope_theta", 1_000_000.0))),
        block_size=block_size,
        target_layer_ids=tuple(
            target_layer_ids(target.num_layers, num_context_layers or num_layers)
        ),
        num_target_layers=target.num_layers,
        mask_token_id=mask.token_id,
        mask_mode=mask.mode,
        max_position=int(getattr(cfg, "max_position_embeddings", 32768)),
        vocab_size=target.vocab_size,
    )


class RMSNorm(nn.Module):
    """Computed in float32 whatever the activations' dtype, as Qwen3 does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        self.register_buffer("inv_freq", 1.0 / theta**exponents, persistent=False)

    def forward(self, positions: torch.Tensor) -> Rope:
        """[B, P] absolute positions -> cos, sin of shape [B, 1, P, head_dim] (float32)."""
        freqs = positions.float()[..., None] * self.inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)[:, None]
        return angles.cos(), angles.sin()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """The attention's weights; DFlashDecoderLayer runs them around `attend`."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)


def _merge_heads(attended: torch.Tensor) -> torch.Tensor:
    """[B, Hq, Q, D] attention output -> [B, Q, Hq*D], the o_proj input."""
    batch, _, queries, _ = attended.shape
    return attended.transpose(1, 2).reshape(batch, queries, -1)


class DFlashMLP(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    # The layer runs as three stretches so the two around attention, all its pointwise work
    # (norms, rotary, residuals, SwiGLU), can be compiled alone (drafter_compile.py), while
    # attention keeps its own kernel and graphs (attention_layout.py).
    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        rope_q: Rope,
        rope_k: Rope,
        layout: AttentionLayout,
    ) -> torch.Tensor:
        q, k, v = self.attention_inputs(x, context, rope_q, rope_k)
        attended = attend(q, k, v, layout, scale=self.self_attn.head_dim**-0.5)
        # Merged here, not in the compiled stretch: flex's output is a slice of its padded
        # one, whose strides would make a graph per padding (the merge copies it anyway).
        return self.attention_output_and_mlp(x, _merge_heads(attended))

    def attention_inputs(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        rope_q: Rope,
        rope_k: Rope,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, Q, H], context [B, S, H] -> q [B, Hq, Q, D], k and v [B, Hkv, S+Q, D], q and
        k normed and rotated."""
        a = self.self_attn
        h = self.input_layernorm(x)
        batch, queries, _ = h.shape
        keys = context.shape[1] + queries
        q = a.q_norm(a.q_proj(h).view(batch, queries, a.num_heads, a.head_dim))
        # One projection for context and block tokens: keys/values = [proj(ctx); proj(h)].
        both = torch.cat((context, h), dim=1)
        k = a.k_norm(a.k_proj(both).view(batch, keys, a.num_kv_heads, a.head_dim))
        v = a.v_proj(both).view(batch, keys, a.num_kv_heads, a.head_dim)
        q = _apply_rotary(q.transpose(1, 2), *rope_q)
        k = _apply_rotary(k.transpose(1, 2), *rope_k)
        return q, k, v.transpose(1, 2)

    def attention_output_and_mlp(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x [B, Q, H], attended [B, Q, Hq*D] (heads merged) -> the layer's output."""
        x = x + self.self_attn.o_proj(attended)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """Parameter names are the z-lab export names, so export copies tensors unrenamed.
    Owns no embedding and no lm_head: the target's frozen ones are passed in."""

    def __init__(self, config: DFlashConfig, attention_backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        # "auto": SDPA with a boolean mask, or flex_attention on CUDA when DFLASH_ATTENTION=flex
        # (attention_layout.py says why SDPA is the default).
        self.attention_backend = attention_backend
        c = config
        self.layers = nn.ModuleList(DFlashDecoderLayer(c) for _ in range(c.num_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.head_dim, c.rope_theta)
        if c.mask_mode == "learned":
            self.mask_embedding = nn.Parameter(torch.empty(c.hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        if self.config.mask_mode == "learned":
            nn.init.normal_(self.mask_embedding, std=0.02)

    def embed_blocks(self, embed_tokens: nn.Embedding, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[B, N] anchor tokens -> [B, N*block_size, H] inputs `[anchor, MASK, MASK, ...]`."""
        batch, blocks = anchor_tokens.shape
        anchor = embed_tokens(anchor_tokens)
        if self.config.mask_mode == "learned":
            mask = self.mask_embedding.to(anchor.dtype)
        else:
            mask = embed_tokens.weight[self.config.mask_token_id].to(anchor.dtype)
        size = self.config.block_size
        filler = mask.expand(batch, blocks, size - 1, anchor.shape[-1])
        return torch.cat((anchor[:, :, None], filler), dim=2).reshape(batch, blocks * size, -1)

    def forward(
        self,
        block_embeds: torch.Tensor,
        context: torch.Tensor,
        anchors: torch.Tensor,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """block_embeds [B, N*bs, H], context [B, S, k*H] (target features at positions
        0..S-1), anchors [B, N] -> final hidden states [B, N*bs, H] of the block tokens.
        Block i sees context positions < anchors[:, i] and its own block, nothing else."""
        batch, queries, _ = block_embeds.shape
        size = self.config.block_size
        if queries != anchors.shape[1] * size:
            raise ValueError(
                f"block_embeds: {queries} positions, expected anchors x block_size = "
                f"{anchors.shape[1]} x {size}"
            )
        if valid is None:
            valid = torch.ones_like(anchors, dtype=torch.bool)
        device_type = block_embeds.device.type
        if not torch.is_autocast_enabled(device_type):
            # Target features arrive in the target's dtype (bf16 on GPU).
            dtype = self.fc.weight.dtype
            block_embeds, context = block_embeds.to(dtype), context.to(dtype)
        ctx = self.hidden_norm(self.fc(context))
        ctx_len = ctx.shape[1]
        offsets = torch.arange(size, device=anchors.device)
        block_pos = (anchors[:, :, None] + offsets).reshape(batch, queries)
        ctx_pos = torch.arange(ctx_len, device=anchors.device).expand(batch, ctx_len)
        rope_q = self.rotary(block_pos)
        rope_k = self.rotary(torch.cat((ctx_pos, block_pos), dim=1))
        layout = build_layout(anchors, valid, ctx_len, size, backend=self.attention_backend)
        # A tensor of its own, not a view of embed_blocks' cat: a compiled layer guards on
        # whether its input is a view, and the first layer would get graphs of its own.
        hidden = block_embeds.clone()
        for layer in self.layers:
            hidden = layer(hidden, ctx, rope_q, rope_k, layout)
        return self.norm(hidden)


def _unwrap(module: nn.Module) -> DFlashDrafter:
    # DDP keeps the model in .module, torch.compile in ._orig_mod.
    while not isinstance(module, DFlashDrafter):
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if inner is None:
            raise TypeError(f"not a DFlashDrafter: {type(module).__name__}")
        module = inner
    return module


def save_drafter(drafter: nn.Module, directory: str | os.PathLike[str]) -> None:
    from safetensors.torch import save_file

    from dflash_train.rundir import atomic_write_text

    model = _unwrap(drafter)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = out / f".{WEIGHTS_FILE}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS_FILE)
    atomic_write_text(out / CONFIG_FILE, json.dumps(model.config.to_dict(), indent=2) + "\n")


def read_drafter_config(directory: str | os.PathLike[str]) -> DFlashConfig:
    path = Path(directory) / CONFIG_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: not found (not a drafter checkpoint)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: malformed JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return DFlashConfig.from_dict(record)


def load_drafter(
    directory: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    from safetensors.torch import load_file

    config = read_drafter_config(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"{weights}: not found")
    drafter = DFlashDrafter(config)
    drafter.load_state_dict(load_file(str(weights)))
    return drafter.to(device=device, dtype=dtype)
