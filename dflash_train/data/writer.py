"""Writing a prepared dataset: Arrow shards plus prepare.json, atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflash_train.data.prepare import Sample

PREPARE_INFO = "prepare.json"


def token_stats(samples: Sequence[Sample]) -> dict[str, Any]:
    lengths = [len(s.input_ids) for s in samples]
    answers = [sum(s.loss_mask) for s in samples]
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
        "mean_length": round(sum(lengths) / len(lengths), 2),
        "mean_answer_tokens": round(sum(answers) / len(answers), 2),
    }


def write_dataset(
    samples: Sequence[Sample],
    out: Path,
    info: dict[str, Any],
    shards: int,
    extra_files: dict[str, str] | None = None,
) -> None:
    """Save to a temp dir beside `out`, then rename: a reader never sees half a dataset, and
    an existing `out` (only replaced with --overwrite) survives any failure before the swap."""
    import datasets

    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int32")),
            "loss_mask": datasets.List(datasets.Value("int8")),
            "prompt_index": datasets.Value("int32"),
        }
    )
    table = datasets.Dataset.from_dict(
        {
            "input_ids": [s.input_ids for s in samples],
            "loss_mask": [s.loss_mask for s in samples],
            "prompt_index": [s.prompt_index for s in samples],
        },
        features=features,
    )
    out = out.absolute()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        # datasets' own progress bar would interleave with ours on stderr.
        quiet = datasets.utils.are_progress_bars_disabled()
        datasets.utils.disable_progress_bars()
        try:
            table.save_to_disk(str(tmp), num_shards=min(shards, len(samples)))
        finally:
            if not quiet:
                datasets.utils.enable_progress_bars()
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / PREPARE_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
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
