"""Randomly initialised targets built from a config (Qwen3-8B/32B, a Qwen3.5-class hybrid,
a tiny CPU one): throughput does not depend on the weights, so big targets need no download."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

SMOLLM2_VOCAB = 49152


@dataclass(frozen=True)
class RandomPreset:
    """A transformers model type and the config fields of one preset."""

    model_type: str
    config: dict[str, Any]

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])


_QWEN3_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "attention_bias": False,
}

RANDOM_PRESETS: dict[str, RandomPreset] = {
    # SmolLM2's vocab, so SmolLM2-tokenized datasets fit; small enough for CPU tests.
    "tiny": RandomPreset(
        "qwen3",
        _QWEN3_COMMON
        | {
            "vocab_size": SMOLLM2_VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 4096,
        },
    ),
    "qwen3-8b": RandomPreset(
        "qwen3",
        _QWEN3_COMMON
        | {
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
        },
    ),
    "qwen3-32b": RandomPreset(
        "qwen3",
        _QWEN3_COMMON
        | {
            "vocab_size": 151936,
            "hidden_size": 5120,
            "intermediate_size": 25600,
            "num_hidden_layers": 64,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
        },
    ),
    # The hybrid architecture at CPU-test size (linear-attention layers run transformers'
    # torch fallback here), so the hybrid path is tested where CI runs.
    "tiny-hybrid": RandomPreset(
        "qwen3_5_text",
        {
            "vocab_size": SMOLLM2_VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "full_attention_interval": 4,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
            },
        },
    ),
    # Qwen3.5-27B-class hybrid: 3 Gated-DeltaNet (linear attention) layers per full-attention
    # layer, transformers' `qwen3_5_text` model type.
    "qwen3.5-27b": RandomPreset(
        "qwen3_5_text",
        {
            "vocab_size": 248320,
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": 64,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "full_attention_interval": 4,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262144,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
            },
        },
    ),
}


def build_random_model(preset: RandomPreset, device: torch.device, dtype: torch.dtype) -> nn.Module:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(preset.model_type, **preset.config)
    # Built directly on the device in the target dtype: a 32B model never visits host memory
    # and HF's init runs as GPU kernels.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model
