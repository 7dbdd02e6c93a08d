"""A SmolLM2 drafter (no spare embedding row) exports in the layout every DFlash engine loads:
an integer mask token of the target's table that never occurs in the training data, only
the reference tensor names, and logits from an independent reader of that layout equal to
the trainer's own forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reference_dflash import ReferenceDFlash
from safetensors import safe_open

from dflash_train.checkpoint import store as checkpoints
from dflash_train.checkpoint.export import export_checkpoint
from dflash_train.data.dataset import load_dataset_dir
from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
from dflash_train.model.mask_token import choose_mask, tokens_seen
from dflash_train.targets.frozen_target import Target, extract_context

PER_LAYER = [
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight",
]  # fmt: skip


@pytest.mark.slow
def test_smollm2_export_is_servable_and_a_reference_reader_agrees(
    tmp_path: Path, smollm2: Target, prepared_data_dir: Path
) -> None:
    dataset = load_dataset_dir(prepared_data_dir)
    seen = tokens_seen(dataset.table, smollm2.vocab_size)
    assert smollm2.vocab_size == len(smollm2.tokenizer)  # no spare row: the hard case
    mask = choose_mask(smollm2.tokenizer, smollm2.vocab_size, seen)
    config = drafter_config_for_target(
        smollm2, num_layers=2, block_size=4, num_context_layers=2, mask=mask
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(config)
    with torch.no_grad():  # not the init's ones: every weight must be read right
        for param in drafter.parameters():
            param.normal_(0.0, 0.05 if param.dim() > 1 else 0.3).add_(
                1.0 if param.dim() == 1 else 0
            )
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    state = checkpoints.TrainState(step=1, epoch=0, consumed=[], tokens_seen=0, run_id="smol")
    ckpt = checkpoints.save_checkpoint(
        tmp_path / "checkpoints" / "smol",
        drafter=drafter,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        state=state,
        rng=checkpoints.capture_rng([]),
        keep=1,
    )
    out = export_checkpoint(ckpt, tmp_path / "export", dtype="float32")

    record = json.loads((out / "config.json").read_text())
    mask_id = record["dflash_config"]["mask_token_id"]
    assert type(mask_id) is int and 0 <= mask_id < smollm2.vocab_size
    assert not seen[mask_id], "the mask token occurs in the training data"
    assert mask_id not in (smollm2.tokenizer.eos_token_id, smollm2.tokenizer.bos_token_id)
    assert record["architectures"] == ["DFlashDraftModel"]
    assert record["dflash_config"]["target_layer_ids"] == list(config.target_layer_ids)
    expected = {f"layers.{i}.{name}" for i in range(2) for name in PER_LAYER}
    expected |= {"norm.weight", "fc.weight", "hidden_norm.weight"}
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert set(fh.keys()) == expected  # no mask_embedding, nothing else

    # Real target features of a real training sample, the way the trainer computes them.
    ids = torch.tensor(dataset.rows([0])[0][0][:20].tolist())[None]
    with torch.no_grad():
        context = extract_context(smollm2, ids, None, config.target_layer_ids)
        anchors = torch.tensor([[3, 9, 15]])
        blocks = drafter.embed_blocks(smollm2.embed_tokens, ids[:, anchors[0]])
        mine = smollm2.lm_head(drafter(blocks, context, anchors))[0].view(3, 4, -1)
    reader = ReferenceDFlash(out)
    for i, anchor in enumerate(anchors[0].tolist()):
        theirs = reader.block_logits(
            smollm2.embed_tokens.weight,
            smollm2.lm_head.weight,
            context[0],
            anchor,
            int(ids[0, anchor]),
        )
        torch.testing.assert_close(mine[i].double(), theirs, rtol=1e-4, atol=1e-4)
