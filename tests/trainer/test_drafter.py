"""The drafter module: config, parameter names, attention layout, save/load."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from drafter_fixtures import HIDDEN, frozen_head, random_context, tiny_config, tiny_drafter

from dflash_train.model.attention_layout import build_layout, dense_mask
from dflash_train.model.drafter import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DFlashConfig,
    DFlashDrafter,
    drafter_config_for_target,
    load_drafter,
    read_drafter_config,
    save_drafter,
)
from dflash_train.model.mask_token import choose_mask
from dflash_train.targets.frozen_target import Target, load_target


def test_config_round_trips_through_json() -> None:
    config = tiny_config()
    again = DFlashConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert isinstance(again.target_layer_ids, tuple)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"mask_mode": "noise"}, "mask_mode"),
        ({"mask_mode": "token", "mask_token_id": None}, "mask_token_id"),
        ({"block_size": 1}, "block_size"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"target_layer_ids": ()}, "target_layer_ids"),
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        tiny_config(**overrides)


def test_config_from_dict_names_missing_field() -> None:
    record = tiny_config().to_dict()
    del record["block_size"]
    with pytest.raises(ValueError, match="missing field 'block_size'"):
        DFlashConfig.from_dict(record)


def _pick(*args: object) -> tuple[str, int | None]:
    choice = choose_mask(*args)  # type: ignore[arg-type]
    return choice.mode, choice.token_id


def test_choose_mask_follows_dflash_rule(smollm2: Target) -> None:
    tokenizer = copy.deepcopy(smollm2.tokenizer)
    seen = np.zeros(49152, dtype=bool)
    seen[[0, 1, 2, 16, 500]] = True  # the chat tokens, one special token, a word
    # SmolLM2: all 49152 rows are tokens -> the highest special token absent from the data
    # (16 <empty_output> occurs here, so 15), never bos/eos/pad/unk.
    assert _pick(tokenizer, 49152, seen) == ("token", 15)
    seen[3:17] = True  # every special token occurs: the highest id that never does
    seen[-1] = True
    assert _pick(tokenizer, 49152, seen) == ("token", 49150)
    with pytest.raises(ValueError, match="all 49152 token ids occur"):
        choose_mask(tokenizer, 49152, np.ones(49152, dtype=bool))
    # Only on request: a learned vector; an explicit id must be in range and unused.
    assert _pick(tokenizer, 49152, seen, "learned") == ("learned", None)
    with pytest.raises(ValueError, match="outside the target's table"):
        choose_mask(tokenizer, 49152, seen, 49152)
    with pytest.raises(ValueError, match="occurs in the training data"):
        choose_mask(tokenizer, 49152, seen, 500)
    # Spare rows -> the first unused one; a tokenizer's mask token first of all.
    assert _pick(tokenizer, 49216, None) == ("token", 49152)
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    assert _pick(tokenizer, 49216, None) == ("token", tokenizer.mask_token_id)


def test_config_for_smollm2_uses_a_real_token(smollm2: Target) -> None:
    config = drafter_config_for_target(smollm2, num_layers=1, block_size=8)
    assert config.mask_mode == "token" and config.mask_token_id == 16
    assert (config.hidden_size, config.num_heads, config.num_kv_heads) == (576, 9, 3)
    assert (config.head_dim, config.intermediate_size) == (64, 1536)
    assert config.target_layer_ids == (15,)
    assert config.num_target_layers == 30 and config.vocab_size == 49152
    assert config.rope_theta == 100000.0


def test_config_for_a_target_with_spare_rows_uses_a_token() -> None:
    target = load_target("random:tiny", "cpu", torch.float32)
    target.model.resize_token_embeddings(49152 + 64)  # as Qwen3's table has spare rows
    target = dataclasses.replace(
        target,
        vocab_size=49152 + 64,
        embed_tokens=target.model.get_input_embeddings(),
        lm_head=target.model.get_output_embeddings(),
    )
    config = drafter_config_for_target(target, num_layers=2)
    assert (config.mask_mode, config.mask_token_id) == ("token", 49152)
    assert config.target_layer_ids == (1, 3)
    assert (config.hidden_size, config.num_heads, config.head_dim) == (64, 4, 16)


def test_parameter_names_are_the_reference_export_names() -> None:
    drafter = tiny_drafter(num_layers=2, mask_mode="token", mask_token_id=3)
    names = set(drafter.state_dict())
    per_layer = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    expected = {f"layers.{i}.{n}" for i in range(2) for n in per_layer}
    expected |= {"norm.weight", "fc.weight", "hidden_norm.weight"}
    assert names == expected
    assert drafter.fc.weight.shape == (HIDDEN, 2 * HIDDEN)
    learned = tiny_drafter(num_layers=2)
    assert set(learned.state_dict()) == expected | {"mask_embedding"}


def test_embed_blocks_layout() -> None:
    embed, _ = frozen_head()
    anchors = torch.tensor([[5, 9]])
    token_mode = tiny_drafter(mask_mode="token", mask_token_id=7)
    blocks = token_mode.embed_blocks(embed, anchors).view(1, 2, 4, HIDDEN)
    torch.testing.assert_close(blocks[0, 1, 0], embed.weight[9])
    torch.testing.assert_close(blocks[0, 0, 1:], embed.weight[7].expand(3, HIDDEN))
    learned = tiny_drafter()
    blocks = learned.embed_blocks(embed, anchors).view(1, 2, 4, HIDDEN)
    torch.testing.assert_close(blocks[0, 0, 0], embed.weight[5])
    torch.testing.assert_close(blocks[0, 1, 3], learned.mask_embedding)


def test_dense_mask_matches_the_rule() -> None:
    anchors = torch.tensor([[1, 4, 6], [0, 2, 5]])
    valid = torch.tensor([[True, True, True], [False, True, True]])
    size, length = 4, 9
    mask = dense_mask(anchors, valid, length, size)[:, 0]
    for b in range(2):
        for q in range(12):
            block = q // size
            for key in range(length + 12):
                if key < length:
                    want = bool(valid[b, block]) and key < int(anchors[b, block])
                else:
                    want = (key - length) // size == block
                assert bool(mask[b, q, key]) == want, (b, q, key)


def test_flex_layout_gives_the_same_outputs_as_sdpa() -> None:
    """The CUDA path's block mask, run by eager flex_attention on the CPU."""
    drafter = tiny_drafter(num_layers=2)
    embed, _ = frozen_head()
    anchors = torch.tensor([[1, 4, 6], [0, 2, 5]])
    valid = torch.tensor([[True, True, True], [False, True, True]])
    context = random_context(2, 11)
    drafter.requires_grad_(False)  # flex has no CPU backward
    block_embeds = drafter.embed_blocks(embed, torch.tensor([[3, 4, 5], [6, 7, 8]]))
    dense = drafter(block_embeds, context, anchors, valid)
    drafter.attention_backend = "flex"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is a slow reference
        flex = drafter(block_embeds, context, anchors, valid)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    assert build_layout(anchors, valid, 11, 4).dense_mask is not None  # CPU: auto is SDPA


def test_forward_rejects_mismatched_blocks() -> None:
    drafter = tiny_drafter()
    with pytest.raises(ValueError, match="anchors x block_size"):
        drafter(torch.zeros(1, 5, HIDDEN), random_context(1, 8), torch.tensor([[1]]))


def test_unknown_attention_backend_is_refused() -> None:
    drafter = tiny_drafter()
    drafter.attention_backend = "xformers"
    with pytest.raises(ValueError, match="attention backend"):
        drafter(torch.zeros(1, 4, HIDDEN), random_context(1, 8), torch.tensor([[1]]))


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    drafter = tiny_drafter(num_layers=2)
    embed, _ = frozen_head()
    save_drafter(drafter, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    loaded = load_drafter(tmp_path, "cpu")
    assert loaded.config == drafter.config
    anchors = torch.tensor([[2, 5]])
    block_embeds = drafter.embed_blocks(embed, torch.tensor([[1, 2]]))
    context = random_context(1, 9)
    torch.testing.assert_close(
        loaded(loaded.embed_blocks(embed, torch.tensor([[1, 2]])), context, anchors),
        drafter(block_embeds, context, anchors),
        rtol=0,
        atol=0,
    )


def test_save_unwraps_wrapped_drafters(tmp_path: Path) -> None:
    class Wrapper(torch.nn.Module):  # the shape DDP has: the model under .module
        def __init__(self, module: DFlashDrafter) -> None:
            super().__init__()
            self.module = module

    drafter = tiny_drafter()
    save_drafter(Wrapper(drafter), tmp_path)
    assert "module.fc.weight" not in load_drafter(tmp_path).state_dict()


def test_load_reports_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a drafter checkpoint"):
        read_drafter_config(tmp_path)
    (tmp_path / CONFIG_FILE).write_text("{")
    with pytest.raises(ValueError, match="malformed JSON"):
        read_drafter_config(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(tiny_config().to_dict()))
    with pytest.raises(ValueError, match=f"{WEIGHTS_FILE}: not found"):
        load_drafter(tmp_path)
