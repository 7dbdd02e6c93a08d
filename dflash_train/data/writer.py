"""Writing a prepared dataset: Arrow shards plus prepare.json, atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREPARE_INFO = "prepare.json"


@dataclass(frozen=True)
class Sample:
    """One conversation as training tokens: the loss mask marks the answers' tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    finished: bool
    prompt_index: int = -1
    turns: int = 1
    turns_truncated: int = 0


STAT_SUMS = (
    "samples",
    "finished",
    "truncated",
    "turns",
    "turns_truncated",
    "tokens",
    "answer_tokens",
)


def token_stats(samples: Sequence[Sample]) -> dict[str, Any]:
    lengths = [len(s.input_ids) for s in samples] or [0]
    answers = [sum(s.loss_mask) for s in samples] or [0]
    return {
        "samples": len(samples),
        "finished": sum(s.finished for s in samples),
        "truncated": sum(not s.finished for s in samples),
        "turns": sum(s.turns for s in samples),
        "turns_truncated": sum(s.turns_truncated for s in samples),
        "tokens": sum(lengths),
        "answer_tokens": sum(answers),
        "min_length": min(lengths),
        "max_length": max(lengths),
        "mean_length": round(sum(lengths) / max(len(samples), 1), 2),
        "mean_answer_tokens": round(sum(answers) / max(len(samples), 1), 2),
    }


def combined_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """token_stats of the union of the parts' samples, from each part's token_stats."""
    full = [p for p in parts if p["samples"]]
    stats: dict[str, Any] = {name: sum(p[name] for p in parts) for name in STAT_SUMS}
    count = max(stats["samples"], 1)
    stats["min_length"] = min((p["min_length"] for p in full), default=0)
    stats["max_length"] = max((p["max_length"] for p in full), default=0)
    stats["mean_length"] = round(stats["tokens"] / count, 2)
    stats["mean_answer_tokens"] = round(stats["answer_tokens"] / count, 2)
    return stats


FEATURES = {"input_ids": "int32", "loss_mask": "int8", "prompt_index": "int32"}


def _features() -> Any:
    import datasets

    return datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value(FEATURES["input_ids"])),
            "loss_mask": datasets.List(datasets.Value(FEATURES["loss_mask"])),
            "prompt_index": datasets.Value(FEATURES["prompt_index"]),
        }
    )


def write_dataset(
    samples: Sequence[Sample],
    out: Path,
    info: dict[str, Any],
    shards: int,
    extra_files: dict[str, str] | None = None,
    *,
    info_name: str = PREPARE_INFO,
) -> None:
    """Save to a temp dir beside `out`, then rename: a reader never sees half a dataset, and
    an existing `out` (only replaced with --overwrite) survives any failure before the swap."""
    import datasets

    table = datasets.Dataset.from_dict(
        {
            "input_ids": [s.input_ids for s in samples],
            "loss_mask": [s.loss_mask for s in samples],
            "prompt_index": [s.prompt_index for s in samples],
        },
        features=_features(),
    )
    save_atomically(table, out, info, shards, extra_files, info_name=info_name)


def merge_parts(
    parts: Sequence[Path],
    out: Path,
    info: dict[str, Any],
    shards: int,
    extra_files: dict[str, str] | None = None,
) -> None:
    """The parts' rows, in the order given, as one dataset at `out` (atomically)."""
    import datasets

    tables = [datasets.load_from_disk(str(part)) for part in parts]
    tables = [t for t in tables if len(t)] or tables[:1]
    save_atomically(datasets.concatenate_datasets(tables), out, info, shards, extra_files)


def save_atomically(
    table: Any,
    out: Path,
    info: dict[str, Any],
    shards: int,
    extra_files: dict[str, str] | None = None,
    *,
    info_name: str = PREPARE_INFO,
) -> None:
    import datasets

    out = out.absolute()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        # datasets' own progress bar would interleave with ours on stderr.
        quiet = datasets.utils.are_progress_bars_disabled()
        datasets.utils.disable_progress_bars()
        try:
            table.save_to_disk(str(tmp), num_shards=max(1, min(shards, len(table))))
        finally:
            if not quiet:
                datasets.utils.enable_progress_bars()
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / info_name).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
