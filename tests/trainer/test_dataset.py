"""Opening a dataset directory: lengths and stats, and a clear error for each broken case."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from dflash_train.data.dataset import DatasetError, load_dataset_dir


def write_dataset(path: Path, rows: dict[str, list[list[int]]], shards: int = 1) -> Path:
    import datasets

    datasets.Dataset.from_dict(rows).save_to_disk(str(path), num_shards=shards)
    return path


@pytest.fixture
def good_dir(tmp_path: Path) -> Path:
    rows = {
        "input_ids": [[1, 2, 3, 4], [5, 6], [7, 8, 9]] * 10,
        "loss_mask": [[0, 0, 1, 1], [0, 1], [0, 1, 1]] * 10,
    }
    return write_dataset(tmp_path / "data", rows, shards=3)


def test_loads_lengths_and_stats(good_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    (good_dir / "prepare.json").write_text(json.dumps({"target": "smollm2"}))
    with caplog.at_level(logging.INFO, logger="dflash_train.data.dataset"):
        dataset = load_dataset_dir(good_dir)
    assert len(dataset) == 30
    assert dataset.lengths.tolist()[:3] == [4, 2, 3]
    stats = dataset.stats.as_dict()
    assert stats["samples"] == 30 and stats["tokens"] == 90 and stats["loss_tokens"] == 50
    assert (stats["min_length"], stats["max_length"], stats["max_token_id"]) == (2, 4, 9)
    assert dataset.prepare_info == {"target": "smollm2"}
    assert "30 samples loaded" in caplog.text
    ids, mask = dataset.rows([2, 0])[0]
    assert ids.tolist() == [7, 8, 9] and mask.tolist() == [0, 1, 1]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not a directory"):
        load_dataset_dir(tmp_path / "absent")
    with pytest.raises(DatasetError, match=r"no state\.json"):
        load_dataset_dir(tmp_path)


def test_missing_column(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"input_ids": [[1, 2]], "labels": [[1, 2]]})
    with pytest.raises(DatasetError, match=r"missing column.*loss_mask.*has input_ids, labels"):
        load_dataset_dir(path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "delete"])
def test_corrupt_shard_is_named(good_dir: Path, damage: str) -> None:
    shard = good_dir / "data-00001-of-00003.arrow"
    if damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    elif damage == "garbage":
        shard.write_bytes(b"not an arrow stream" * 50)
    elif damage == "empty":
        shard.write_bytes(b"")
    else:
        shard.unlink()
    with pytest.raises(DatasetError) as info:
        load_dataset_dir(good_dir)
    message = str(info.value)
    assert "data-00001-of-00003.arrow" in message
    assert "\n" not in message


def test_corrupt_state_json(good_dir: Path) -> None:
    (good_dir / "state.json").write_text("{")
    with pytest.raises(DatasetError, match=r"state\.json"):
        load_dataset_dir(good_dir)


def test_inconsistent_rows(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "a", {"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1]]})
    with pytest.raises(DatasetError, match="sample 0 has 3 input_ids but 2 loss_mask"):
        load_dataset_dir(path)
    path = write_dataset(tmp_path / "b", {"input_ids": [[1, 2]], "loss_mask": [[0, 2]]})
    with pytest.raises(DatasetError, match="values other than 0 and 1"):
        load_dataset_dir(path)
    path = write_dataset(tmp_path / "c", {"input_ids": [[1], []], "loss_mask": [[1], []]})
    with pytest.raises(DatasetError, match="sample 1 is empty"):
        load_dataset_dir(path)
    path = write_dataset(tmp_path / "e", {"input_ids": [], "loss_mask": []})
    with pytest.raises(DatasetError, match="no samples"):
        load_dataset_dir(path)
