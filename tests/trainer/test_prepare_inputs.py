"""The inputs users have: parquet and JSON Lines files and directories of them, one-line errors
naming the file and the line (or row) at fault, a system prompt for every conversation, and
options for the chat template itself (Qwen3's enable_thinking), through the real SmolLM2
tokenizer and target."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dflash_train.data.chat_tokens import TurnBuilder
from dflash_train.data.conversations import load_conversations, user_turn
from dflash_train.data.prepare import PrepareConfig, PrepareError, prepare_dataset
from dflash_train.data.prompts import PromptError
from dflash_train.targets.frozen_target import Target

ROWS = [
    {"messages": [{"role": "user", "content": "Name a colour."}]},
    {"prompt": "Count to three."},
]
# A Qwen3-style switch in a template: thinking off writes an empty think block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def _parquet(path: Path, rows: list[dict[str, object]]) -> Path:
    """Columns are the rows' keys together; a row without one holds null there."""
    names = list(dict.fromkeys(k for row in rows for k in row))
    pq.write_table(pa.table({k: [row.get(k) for row in rows] for k in names}), path)
    return path


def test_parquet_jsonl_and_directories_read_alike(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "more").mkdir(parents=True)
    _parquet(data / "a.parquet", ROWS)
    (data / "more" / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (data / "notes.md").write_text("not data: ignored")
    (data / ".out.prepare" / "chunks").mkdir(parents=True)  # a prepare's work dir in there
    (data / ".out.prepare" / "chunks" / "chunk_000000.jsonl").write_text('{"index": 0}\n')
    from_parquet = load_conversations(str(data / "a.parquet"))
    assert [c[0].content for c in from_parquet] == ["Name a colour.", "Count to three."]
    assert load_conversations(str(data)) == from_parquet * 2, "name order, any depth"


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("bad.jsonl", '{"prompt": "fine"}\n{"prompt": 3}\n', "bad.jsonl: line 2: prompt: expected"),
        ("bad.jsonl", '{"prompt": "ok"}\n\n{oops\n', "bad.jsonl: line 3: not JSON"),
        ("bad.parquet", [{"prompt": "ok"}, {"prompt": ""}, {"nothing": "x"}], "row 3: no string"),
        ("bad.parquet", b"PAR1 not really", "bad.parquet: not a readable parquet file"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_line(
    tmp_path: Path, name: str, content: object, reason: str
) -> None:
    folder = tmp_path / "prompts"
    folder.mkdir()
    _parquet(folder / "a_good.parquet", ROWS)
    path = folder / name
    if isinstance(content, list):
        _parquet(path, content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    for spec in (str(path), str(folder)):  # alone, and inside a directory
        with pytest.raises(PromptError) as caught:
            load_conversations(spec)
        message = str(caught.value)
        assert reason in message and str(path) in message and "\n" not in message, message


def test_an_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match=r"a directory without \.jsonl, \.parquet or \.txt files"):
        load_conversations(str(tmp_path))


def test_system_prompt_and_template_kwargs_reach_the_samples(
    smollm2: Target, tmp_path: Path
) -> None:
    prompts = _parquet(tmp_path / "p.parquet", ROWS)
    out = tmp_path / "out"
    config = PrepareConfig(
        target="smollm2", prompts=str(prompts), out=out, max_new_tokens=2, batch_size=2,
        system="Answer in French.",
    )  # fmt: skip
    prepare_dataset(config, target=smollm2)
    text = [smollm2.tokenizer.decode(ids) for ids in datasets.load_from_disk(str(out))["input_ids"]]
    assert all("<|im_start|>system\nAnswer in French.<|im_end|>" in t for t in text)
    assert "Count to three." in text[1]

    tokenizer = copy.deepcopy(smollm2.tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    conversation = user_turn("Hi")
    plain = TurnBuilder(tokenizer, conversation).prompt_ids(1)
    off = TurnBuilder(tokenizer, conversation, {"enable_thinking": False}).prompt_ids(1)
    assert tokenizer.decode(off).endswith("<think>\n\n</think>\n\n")
    assert tokenizer.decode(off).startswith(tokenizer.decode(plain))


def test_bad_chat_template_kwargs_are_refused_by_name(tmp_path: Path) -> None:
    for value, reason in (("{nope", "not JSON"), ('["x"]', "expected a JSON object")):
        config = PrepareConfig(
            target="smollm2", prompts="builtin", out=tmp_path / "o", chat_template_kwargs=value
        )
        with pytest.raises(PrepareError, match=f"^chat-template-kwargs: {reason}"):
            config.validate()
