"""A from-scratch reader of the z-lab DFlash export layout (DFLASH.md), written only from the
layout and the paper's description, sharing no code with dflash_train: read config.json and
model.safetensors, embed `[anchor, MASK, ...]` with the target's own table and the integer
`mask_token_id`, run each block against the target context strictly before its anchor, and
project with the target's lm_head. What an inference engine's loader has to do."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [heads, P, d] rotated by absolute positions [P] (halves layout, as Qwen3)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv[None]
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(x.dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-second, first), -1) * sin


class ReferenceDFlash:
    def __init__(self, export_dir: Path) -> None:
        self.config: dict[str, Any] = json.loads((export_dir / "config.json").read_text())
        self.w = {
            k: v.double() for k, v in load_file(str(export_dir / "model.safetensors")).items()
        }
        c = self.config
        self.mask_token_id = c["dflash_config"]["mask_token_id"]
        self.block_size = c["block_size"]
        self.eps = c["rms_norm_eps"]
        self.theta = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta"))

    def block_logits(
        self,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        target_hidden: torch.Tensor,
        anchor: int,
        anchor_token: int,
    ) -> torch.Tensor:
        """Logits [block_size, vocab] of the block drafted at `anchor` of one sequence;
        `target_hidden` [S, k*H] holds the target's selected layers at positions 0..S-1."""
        c, w = self.config, self.w
        heads, kv_heads, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        tokens = [anchor_token] + [self.mask_token_id] * (self.block_size - 1)
        x = embed.double()[tokens]
        ctx = _rms(
            target_hidden.double()[:anchor] @ w["fc.weight"].T, w["hidden_norm.weight"], self.eps
        )
        q_pos = torch.arange(anchor, anchor + self.block_size)
        k_pos = torch.cat((torch.arange(anchor), q_pos))
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            h = _rms(x, w[p + "input_layernorm.weight"], self.eps)
            both = torch.cat((ctx, h))
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(-1, heads, d).transpose(0, 1)
            k = (both @ w[p + "self_attn.k_proj.weight"].T).view(-1, kv_heads, d).transpose(0, 1)
            v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, kv_heads, d).transpose(0, 1)
            q = _rope(_rms(q, w[p + "self_attn.q_norm.weight"], self.eps), q_pos, self.theta)
            k = _rope(_rms(k, w[p + "self_attn.k_norm.weight"], self.eps), k_pos, self.theta)
            group = heads // kv_heads
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            # Every block token sees the whole prefix before the anchor and its whole block.
            attn = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1) @ v
            x = (
                x
                + attn.transpose(0, 1).reshape(len(tokens), -1) @ w[p + "self_attn.o_proj.weight"].T
            )
            h = _rms(x, w[p + "post_attention_layernorm.weight"], self.eps)
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return _rms(x, w["norm.weight"], self.eps) @ lm_head.double().T
