"""Prompt sources: the built-in set and its held-out split, text and JSON Lines files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_train.data.prompts import PromptError, builtin_prompts, load_prompts


def test_builtin_splits_are_disjoint_and_cover_everything() -> None:
    everything = builtin_prompts()
    train = load_prompts("builtin", "train")
    held_out = load_prompts("builtin", "eval")
    assert len(everything) >= 300
    assert len(held_out) == 40
    assert not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(everything)
    assert len(set(everything)) == len(everything), "built-in prompts must be unique"


def test_builtin_eval_split_spans_the_whole_file() -> None:
    everything = builtin_prompts()
    positions = [everything.index(p) for p in load_prompts("builtin", "eval")]
    assert positions[0] < 20
    assert positions[-1] > len(everything) - 20


def test_builtin_prompts_vary_in_length() -> None:
    lengths = sorted(len(p.split()) for p in builtin_prompts())
    assert lengths[0] <= 6
    assert lengths[-1] >= 30


def test_text_file_gives_every_line_for_both_splits(tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \n# not a comment in user files\n")
    expected = ["first prompt", "second prompt", "# not a comment in user files"]
    assert load_prompts(str(path), "train") == expected
    assert load_prompts(str(path), "eval") == expected


def test_jsonl_file_reads_the_prompt_field(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    records = [{"prompt": "line one\nline two", "id": 1}, {"prompt": "third"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert load_prompts(str(path)) == ["line one\nline two", "third"]


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("", ".txt", "holds no prompts"),
        ("\n  \n", ".txt", "holds no prompts"),
        ('{"prompt": "ok"}\n{"text": "no prompt"}\n', ".jsonl", "line 2: no string field"),
        ('{"prompt": "ok"}\nnot json\n', ".jsonl", "line 2: not JSON"),
        ("[1, 2]\n", ".jsonl", "line 1: no string field"),
    ],
)
def test_bad_files_give_one_line_errors(
    tmp_path: Path, content: str, suffix: str, message: str
) -> None:
    path = tmp_path / f"prompts{suffix}"
    path.write_text(content)
    with pytest.raises(PromptError, match=message) as info:
        load_prompts(str(path))
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_and_directory_and_bad_split(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="no such file"):
        load_prompts(str(tmp_path / "absent.txt"))
    with pytest.raises(PromptError, match="not a regular file"):
        load_prompts(str(tmp_path))
    with pytest.raises(PromptError, match="split"):
        load_prompts("builtin", "test")  # type: ignore[arg-type]


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(PromptError, match="not UTF-8"):
        load_prompts(str(path))
