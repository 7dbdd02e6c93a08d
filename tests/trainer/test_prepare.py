"""prepare: the target's own greedy answers, masked on the answer only, written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_train import protocol
from dflash_train.data.dataset import load_dataset_dir
from dflash_train.data.prepare import PrepareConfig, PrepareError
from dflash_train.data.prompts import load_prompts
from dflash_train.data.writer import Sample, write_dataset
from dflash_train.targets.frozen_target import Target

EOS = 2  # SmolLM2's <|im_end|>, also its pad token


def prepare_cli(*args: str, timeout: float = 300) -> tuple[int, protocol.Reply, str]:
    result = subprocess.run(
        [sys.executable, "-m", "dflash_train", "prepare", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    reply = protocol.decode_reply(result.stdout)
    assert isinstance(reply, protocol.Reply), (result.stdout, result.stderr[-2000:])
    return result.returncode, reply, result.stderr


def greedy_loop(target: Target, prompt_ids: list[int], steps: int) -> list[int]:
    """A plain argmax loop over the KV cache, one unpadded sequence: the reference the
    batched, left-padded generation must reproduce."""
    out: list[int] = []
    with torch.inference_mode():
        result = target.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        for _ in range(steps):
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            if token == EOS:
                break
            result = target.model(
                input_ids=torch.tensor([[token]]),
                cache=result.cache,
                use_cache=True,
            )
    return out


def test_prepared_samples_are_masked_on_the_answer(
    prepared_data_dir: Path, smollm2: Target
) -> None:
    dataset = load_dataset_dir(prepared_data_dir)
    assert len(dataset) == 24
    train_prompts = load_prompts("builtin", "train")
    prompt_indices = dataset.table["prompt_index"]
    # A seeded random order over the prompts: 24 distinct ones, not just the first 24.
    assert len(set(prompt_indices)) == 24 and max(prompt_indices) > 24
    tokenizer = smollm2.tokenizer
    for index, prompt_index in enumerate(prompt_indices):
        prompt = train_prompts[prompt_index]
        ids, mask = dataset.rows([index])[0]
        answer_start = int((mask == 0).sum())
        # The mask is 0 on the whole template + user turn, then 1 to the end.
        assert mask[:answer_start].sum() == 0 and mask[answer_start:].all()
        assert 1 <= len(ids) - answer_start <= 48
        context = tokenizer.decode(ids[:answer_start].tolist())
        assert context.endswith("<|im_start|>assistant\n")
        assert f"<|im_start|>user\n{prompt}<|im_end|>" in context
        # The context is exactly the chat template's rendering of the user turn.
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=False,
        )
        expected = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert ids[:answer_start].tolist() == expected
        # An end-of-turn token can only be the last answer token.
        assert EOS not in ids[answer_start:-1].tolist()


def test_batched_generation_matches_a_plain_greedy_loop(
    prepared_data_dir: Path, smollm2: Target
) -> None:
    """SmolLM2's pad id equals its eos id: batched generation without an explicit attention
    mask would decode differently. Samples of different prompt lengths shared batches."""
    dataset = load_dataset_dir(prepared_data_dir)
    for index in (0, 5, 23):
        ids, mask = dataset.rows([index])[0]
        answer_start = int((mask == 0).sum())
        answer = ids[answer_start:].tolist()
        assert greedy_loop(smollm2, ids[:answer_start].tolist(), len(answer)) == answer


def test_prepare_json_records_the_run(prepared_data_dir: Path) -> None:
    info = json.loads((prepared_data_dir / "prepare.json").read_text())
    assert info["target"] == "smollm2" and info["prompts"] == "builtin"
    assert info["prompt_count"] == 280 and info["passes"] == 1
    assert info["repeat_temperature"] is None
    stats = info["stats"]
    assert stats["samples"] == 24
    assert stats["finished"] + stats["truncated"] == 24
    dataset = load_dataset_dir(prepared_data_dir)
    assert stats["tokens"] == dataset.stats.tokens
    assert stats["answer_tokens"] == dataset.stats.loss_tokens
    assert info["config"]["max_new_tokens"] == 48
    assert len(list(prepared_data_dir.glob("data-*.arrow"))) == 2


def test_failed_write_keeps_the_old_dataset(tmp_path: Path) -> None:
    out = tmp_path / "data"
    samples = [Sample([1, 2, 3], [0, 1, 1], True)]
    write_dataset(samples, out, {"n": 1}, shards=1)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(TypeError):
        # Not JSON-serialisable: fails after the Arrow files were written to the temp dir.
        write_dataset(samples * 2, out, {"n": object()}, shards=1)
    assert sorted(p.name for p in out.iterdir()) == before
    assert len(load_dataset_dir(out)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["data"], "temp dir left behind"
    write_dataset(samples * 2, out, {"n": 2}, shards=1)
    assert len(load_dataset_dir(out)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("samples", 0, "samples: 0 must be at least 1"),
        ("max_new_tokens", 0, "max-new-tokens: 0"),
        ("batch_size", -1, "batch-size: -1"),
        ("temperature", -0.5, "temperature: -0.5 must not be negative"),
        ("num_shards", 0, "num-shards: 0"),
        ("devices", "tpu", "devices: 'tpu' is not a device"),
        ("chunk_size", 0, "chunk-size: 0 must be at least 1"),
        ("chat_template_kwargs", "[1]", "chat-template-kwargs: expected a JSON object"),
    ],
)
def test_config_validation(tmp_path: Path, field: str, value: object, reason: str) -> None:
    config = PrepareConfig(target="smollm2", prompts="builtin", out=tmp_path / "d")
    bad = PrepareConfig(**{**config.__dict__, field: value})
    with pytest.raises(PrepareError, match=reason):
        bad.validate()
    config.validate()


def test_out_may_name_folders_not_made_yet_but_not_a_file(tmp_path: Path) -> None:
    # README's first command, `--out data/smol`, in a fresh checkout: data/ is made.
    fresh = PrepareConfig(target="smollm2", prompts="builtin", out=tmp_path / "data" / "smol")
    fresh.validate()
    (tmp_path / "file").write_text("x")
    under_a_file = PrepareConfig(**{**fresh.__dict__, "out": tmp_path / "file" / "a" / "b"})
    with pytest.raises(PrepareError, match=f"^out: {tmp_path / 'file'} is not a directory$"):
        under_a_file.validate()


def test_cli_refuses_bad_input_without_touching_anything(tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("precious")
    rc, reply, _ = prepare_cli(
        "--target-model", "smollm2", "--prompts", "builtin", "--out", str(existing)
    )
    assert rc == 2 and not reply.ok and reply.error_code == "bad_argument"
    assert "already exists" in str(reply.error) and "--overwrite" in str(reply.error)
    assert (existing / "keep.txt").read_text() == "precious"

    rc, reply, _ = prepare_cli(
        "--target-model", "smollm2", "--prompts", str(tmp_path / "nope.txt"),
        "--out", str(tmp_path / "new"),
    )  # fmt: skip
    assert rc == 2 and "no such file" in str(reply.error)
    rc, reply, _ = prepare_cli(
        "--target-model", "/no/such/model", "--prompts", "builtin", "--out", str(tmp_path / "n")
    )
    assert rc == 2 and "config.json" in str(reply.error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]


def test_cli_cycles_prompts_and_overwrites(tmp_path: Path, smollm2_target: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "Write a short poem about the ocean at night."})
        + "\n"
        + json.dumps({"prompt": "Name three primary colors."})
        + "\n"
    )
    out = tmp_path / "data"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    args = ["--target-model", "smollm2", "--prompts", str(prompts), "--out", str(out)]
    args += ["--samples", "4", "--max-new-tokens", "12", "--num-shards", "2", "--overwrite"]
    rc, reply, stderr = prepare_cli(*args)
    assert rc == 0 and reply.ok, reply
    assert "prepare" in stderr and "4/4" in stderr, "tqdm progress goes to stderr"
    assert reply.data["passes"] == 2 and reply.data["repeat_temperature"] == 0.7
    assert reply.data["out"] == str(out)
    assert not (out / "stale.txt").exists()
    dataset = load_dataset_dir(out)
    assert len(dataset) == 4
    rows = dataset.rows([0, 1, 2, 3])
    assert dataset.table["prompt_index"][2:] == dataset.table["prompt_index"][:2]
    # The second pass repeats the prompts (same context) but samples a different answer.
    for first, again in ((rows[0], rows[2]), (rows[1], rows[3])):
        start = int((first[1] == 0).sum())
        assert first[0][:start].tolist() == again[0][:start].tolist()
    assert rows[0][0].tolist() != rows[2][0].tolist()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
