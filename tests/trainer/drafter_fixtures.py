"""Tiny drafters and a tiny stand-in target head for the drafter and loss tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dflash_train.model.drafter import DFlashConfig, DFlashDrafter
from dflash_train.pipeline.drafter_step import DrafterStepper, StepConfig
from dflash_train.pipeline.stage_timers import StageTimers

VOCAB = 40
HIDDEN = 32


def tiny_config(**overrides: object) -> DFlashConfig:
    values: dict[str, object] = {
        "hidden_size": HIDDEN,
        "num_layers": 1,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "block_size": 4,
        "target_layer_ids": (1, 3),
        "num_target_layers": 6,
        "mask_token_id": None,
        "mask_mode": "learned",
        "max_position": 512,
        "vocab_size": VOCAB,
    }
    values.update(overrides)
    return DFlashConfig(**values)  # type: ignore[arg-type]


def tiny_drafter(seed: int = 0, **overrides: object) -> DFlashDrafter:
    torch.manual_seed(seed)
    return DFlashDrafter(tiny_config(**overrides))


def frozen_head(seed: int = 1) -> tuple[nn.Embedding, nn.Linear]:
    """A frozen embedding + lm_head pair, as the target lends them to the drafter."""
    torch.manual_seed(seed)
    embed = nn.Embedding(VOCAB, HIDDEN)
    head = nn.Linear(HIDDEN, VOCAB, bias=False)
    embed.requires_grad_(False)
    head.requires_grad_(False)
    return embed, head


def random_context(batch: int, length: int, seed: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, 2 * HIDDEN, generator=generator)


def tiny_stepper(drafter: DFlashDrafter, num_anchors: int) -> DrafterStepper:
    """The trainer's drafter stepper on the CPU, with frozen_head()'s embedding and head."""
    embed, head = frozen_head()
    config = StepConfig(
        lr=1e-3, weight_decay=0.0, warmup_steps=1, total_steps=10, grad_clip=1.0,
        block_size=drafter.config.block_size, num_anchors=num_anchors, seed=0,
    )  # fmt: skip
    return DrafterStepper(
        drafter, drafter, embed_tokens=embed, lm_head=head, config=config,
        device=torch.device("cpu"), timers=StageTimers(),
    )  # fmt: skip


def open_cpu_flex_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch refuses a CPU flex_attention backward only at its front door: open it (the
    math backward behind it runs)."""
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setattr(flex_module, "_validate_device", lambda *_a: None)
