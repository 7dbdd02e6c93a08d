"""Target specs, layer selection, the hooked hidden-state extraction and the SmolLM2 cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from dflash_train.targets import frozen_target as targets
from dflash_train.targets.frozen_target import (
    Target,
    extract_context,
    resolve_target,
    target_layer_ids,
)
from dflash_train.targets.presets import RANDOM_PRESETS, build_random_model


def test_resolve_forms(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 4, "hidden_size": 32, "vocab_size": 100})
    )
    hf = resolve_target(str(tmp_path))
    assert (hf.kind, hf.path, hf.num_layers, hf.hidden_size, hf.vocab_size) == (
        "hf",
        tmp_path,
        4,
        32,
        100,
    )
    smol = resolve_target("smollm2")
    assert (smol.kind, smol.num_layers, smol.hidden_size, smol.vocab_size) == (
        "smollm2",
        30,
        576,
        49152,
    )
    big = resolve_target("random:qwen3-8b")
    assert (big.kind, big.preset, big.num_layers, big.hidden_size) == (
        "random",
        "qwen3-8b",
        36,
        4096,
    )


def test_resolve_reads_text_config_of_multimodal_models(tmp_path: Path) -> None:
    text = {"num_hidden_layers": 64, "hidden_size": 5120, "vocab_size": 248320}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": text}))
    assert resolve_target(str(tmp_path)).num_layers == 64


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("random:nope", "unknown preset 'nope'"),
        ("/no/such/dir", "not a directory with config.json"),
        ("", "not a directory with config.json"),
    ],
)
def test_resolve_rejects_bad_specs(spec: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as info:
        resolve_target(spec)
    message = str(info.value)
    assert "random:<preset>" in message and "\n" not in message


def test_resolve_rejects_unreadable_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"unreadable config\.json"):
        resolve_target(str(tmp_path))


def test_resolve_does_not_import_torch() -> None:
    code = (
        "import sys; from dflash_train.targets.frozen_target import resolve_target; "
        "resolve_target('random:qwen3-32b'); resolve_target('smollm2'); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_layer_ids() -> None:
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert target_layer_ids(36, 1) == [18]
    assert target_layer_ids(30, 1) == [15]
    assert target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    with pytest.raises(ValueError, match="do not fit"):
        target_layer_ids(6, 4)
    with pytest.raises(ValueError, match="at least 1"):
        target_layer_ids(6, 0)


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-32b", "qwen3.5-27b"])
def test_big_presets_have_their_real_size(name: str) -> None:
    # Built on the meta device: shapes only, no memory, no init cost.
    model = build_random_model(RANDOM_PRESETS[name], torch.device("meta"), torch.bfloat16)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    expected = {"qwen3-8b": 8.19, "qwen3-32b": 32.76, "qwen3.5-27b": 26.9}[name]
    assert abs(billions - expected) < 0.1
    if name == "qwen3.5-27b":
        kinds = model.config.layer_types
        assert kinds[:4] == ["linear_attention"] * 3 + ["full_attention"]


def _reference_context(target: Target, ids: torch.Tensor, mask: torch.Tensor, layer_ids: list[int]):
    with torch.inference_mode():
        out = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


@pytest.mark.parametrize(
    "layer_ids",
    [[1, 3], [3, 1], [2], [5], [0, 2, 4]],
    ids=["pair", "unsorted", "one", "last", "k3"],
)
def test_extract_context_equals_output_hidden_states_tiny(
    tiny_target: Target, layer_ids: list[int]
) -> None:
    ids = torch.randint(0, tiny_target.vocab_size, (2, 17))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # right padding
    got = extract_context(tiny_target, ids, mask, layer_ids)
    assert got.shape == (2, 17, len(layer_ids) * tiny_target.hidden_size)
    torch.testing.assert_close(got, _reference_context(tiny_target, ids, mask, layer_ids))


@pytest.mark.parametrize("layer_ids", [[1, 3], [0, 3, 6], [7]], ids=["pair", "k3", "last"])
def test_extract_context_on_the_hybrid_equals_output_hidden_states(
    model_cache: None, layer_ids: list[int]
) -> None:
    # Linear-attention (Gated DeltaNet) layers carry a recurrent state and a causal conv:
    # the early stop after the deepest hooked layer must not change what those layers see.
    torch.manual_seed(0)
    hybrid = targets.load_target("random:tiny-hybrid", "cpu", torch.float32)
    assert hybrid.model.config.layer_types[3] == "full_attention"
    ids = torch.randint(0, hybrid.vocab_size, (2, 23))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # right padding
    got = extract_context(hybrid, ids, mask, layer_ids)
    torch.testing.assert_close(got, _reference_context(hybrid, ids, mask, layer_ids))


def test_extract_context_equals_output_hidden_states_smollm2(smollm2: Target) -> None:
    layer_ids = target_layer_ids(smollm2.num_layers, 3)
    ids = smollm2.tokenizer("The capital of France is Paris.", return_tensors="pt").input_ids
    mask = torch.ones_like(ids)
    got = extract_context(smollm2, ids, mask, layer_ids)
    torch.testing.assert_close(got, _reference_context(smollm2, ids, mask, layer_ids))


def test_extract_context_stops_after_the_deepest_layer(tiny_target: Target) -> None:
    calls: list[int] = []
    hooks_before = [len(layer._forward_hooks) for layer in tiny_target.layers]
    handles = [
        layer.register_forward_pre_hook(lambda _m, _a, i=i: calls.append(i))
        for i, layer in enumerate(tiny_target.layers)
    ]
    try:
        extract_context(tiny_target, torch.tensor([[1, 2, 3]]), None, [2, 1])
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [0, 1, 2]
    assert [len(layer._forward_hooks) for layer in tiny_target.layers] == hooks_before


def test_extract_context_rejects_out_of_range_layer(tiny_target: Target) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.5"):
        extract_context(tiny_target, torch.tensor([[1, 2]]), None, [6])


def test_loaded_target_is_frozen(smollm2: Target) -> None:
    assert not smollm2.model.training
    assert all(not p.requires_grad for p in smollm2.model.parameters())
    assert smollm2.embed_tokens.weight.shape == (49152, 576)
    assert smollm2.lm_head.weight.shape == (49152, 576)
    assert smollm2.tokenizer.eos_token_id == 2


def test_random_preset_uses_smollm2_tokenizer(tiny_target: Target) -> None:
    assert tiny_target.vocab_size == 49152 and tiny_target.num_layers == 6
    assert tiny_target.tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


def test_smollm2_answers_sensibly(smollm2: Target) -> None:
    tok = smollm2.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    ids = enc["input_ids"]
    with torch.inference_mode():
        for _ in range(8):
            nxt = smollm2.model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    assert "Paris" in tok.decode(ids[0, enc["input_ids"].shape[1] :])


def test_concurrent_first_use_waits_for_one_conversion(
    smollm2: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second process arriving while a conversion holds the lock waits, then takes the
    finished directory instead of converting again or reading a half-written one."""
    converted = resolve_target("smollm2").path
    assert converted is not None and converted.is_dir()
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    dest = targets.smollm2_cache_dir()
    dest.parent.mkdir(parents=True)
    code = (
        "from dflash_train.targets.frozen_target import ensure_smollm2_converted; "
        "print('calling', flush=True); print(ensure_smollm2_converted())"
    )
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        waiter = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(os.environ), text=True
        )
        # Its imports done (however slow a loaded machine makes them), the call reaches the
        # lock at once; a moment later it must still be waiting there.
        assert waiter.stdout is not None and waiter.stdout.readline() == "calling\n"
        time.sleep(1.0)
        assert waiter.poll() is None, "the second process must wait for the lock"
        # Finish "our" conversion: the same rename a real one ends with.
        staging = dest.parent / ".staging"
        staging.mkdir()
        for item in converted.iterdir():
            (staging / item.name).symlink_to(item)
        os.rename(staging, dest)
    out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == 0
    assert out.strip() == str(dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == sorted(
        [dest.name, f".{dest.name}.lock"]
    )


def test_context_layer_count_defaults_to_five_capped_by_depth() -> None:
    from dflash_train.targets.frozen_target import context_layer_count

    assert context_layer_count(36, None) == 5
    assert context_layer_count(6, None) == 3  # random:tiny: 5 ids would not fit
    assert context_layer_count(4, None) == 1
    assert context_layer_count(36, 2) == 2
    assert len(set(target_layer_ids(6, context_layer_count(6, None)))) == 3
