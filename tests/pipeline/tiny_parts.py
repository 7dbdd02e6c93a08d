"""Small real parts for pipeline unit tests: a one-layer drafter with its own frozen
embedding and lm_head, and HiddenBatches made from random tensors."""

from __future__ import annotations

import torch

from dflash_train.model.drafter import DFlashConfig, DFlashDrafter
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.pipeline.target_workers import HiddenBatch

HIDDEN = 32
VOCAB = 97
BLOCK = 4


def tiny_drafter() -> tuple[DFlashDrafter, torch.nn.Embedding, torch.nn.Linear]:
    torch.manual_seed(0)
    config = DFlashConfig(
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        block_size=BLOCK,
        target_layer_ids=(1,),
        num_target_layers=4,
        mask_token_id=None,
        mask_mode="learned",
        max_position=512,
        vocab_size=VOCAB,
    )
    embed = torch.nn.Embedding(VOCAB, HIDDEN).requires_grad_(False)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)
    return DFlashDrafter(config), embed, head


def hidden_batch(position: int, *, length: int = 24, rows: int = 2, seed: int = 0) -> HiddenBatch:
    gen = torch.Generator().manual_seed(seed + position)
    ids = torch.randint(0, VOCAB, (rows, length), generator=gen)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[:, : length // 4] = 0
    return HiddenBatch(
        position=position,
        bucket=0,
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=mask,
        context=torch.randn(rows, length, HIDDEN, generator=gen),
        tokens=rows * length,
    )


def timers() -> StageTimers:
    return StageTimers()
