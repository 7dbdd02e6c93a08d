"""`train --data-dir A --data-dir 'B*2'`: several prepared dirs trained on as one dataset, each
taken K times an epoch, after one check that they were tokenised alike (prepare.json's
tokenizer fingerprint, written by the real prepare with SmolLM2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_train.data.dataset import DatasetError, load_data_dirs, load_dataset_dir


def test_dirs_are_concatenated_with_weights(prepared_data_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(prepared_data_dir, other)
    one = load_dataset_dir(prepared_data_dir)
    both = load_data_dirs((str(prepared_data_dir), f"{other}*2"))
    assert len(both) == 3 * len(one) and both.stats.tokens == 3 * one.stats.tokens
    assert both.lengths.tolist() == one.lengths.tolist() * 3
    first, last = both.rows([0, len(both) - 1])
    expected = one.rows([0, len(one) - 1])
    assert first[0].tolist() == expected[0][0].tolist()
    assert last[0].tolist() == expected[1][0].tolist()
    sources = both.prepare_info["sources"]
    assert [s["weight"] for s in sources] == [1, 2]


def test_another_tokenizer_is_refused_naming_the_dir(
    prepared_data_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(prepared_data_dir, other)
    info = json.loads((other / "prepare.json").read_text())
    assert info["tokenizer"]["vocab_size"] == 49152, "prepare records its tokenizer"
    info["tokenizer"] = {"vocab_size": 151669, "sha256": "0123456789abcdef"}
    (other / "prepare.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=f"data dir {other}: prepared with another tokenizer"):
        load_data_dirs((str(prepared_data_dir), str(other)))


def test_the_command_line_takes_the_flag_again(prepared_data_dir: Path, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "dflash_train", "train", "--target-model", "smollm2"]
    argv += ["--data-dir", str(prepared_data_dir), "--data-dir", f"{tmp_path}*2"]
    argv += ["--output-dir", str(tmp_path / "run"), "--print-config"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    values = printed.get("config", printed)
    found = json.dumps(values)
    assert json.dumps([str(prepared_data_dir), f"{tmp_path}*2"]) in found, found[:500]
