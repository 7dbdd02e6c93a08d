"""Opens a prepared dataset directory (Arrow shards, memory-mapped) and checks it is whole,
so a bad dataset stops the trainer at start-up with one clear line instead of mid-epoch."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dflash_train.data.dir_specs import data_dir_specs, spec_parts

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("input_ids", "loss_mask")


class DatasetError(ValueError):
    """A one-line, operator-facing reason the dataset directory cannot be used."""


@dataclass(frozen=True)
class DatasetStats:
    samples: int
    tokens: int
    loss_tokens: int
    min_length: int
    max_length: int
    mean_length: float
    max_token_id: int

    def as_dict(self) -> dict[str, int | float]:
        return {
            "samples": self.samples,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "min_length": self.min_length,
            "max_length": self.max_length,
            "mean_length": round(self.mean_length, 2),
            "max_token_id": self.max_token_id,
        }


@dataclass(frozen=True)
class TokenDataset:
    """A loaded dataset: the lazy Arrow table plus the per-sample lengths (the only thing
    held as a Python-side array, since batching needs all of them every epoch)."""

    path: Path
    table: datasets.Dataset
    lengths: np.ndarray
    stats: DatasetStats
    prepare_info: dict[str, Any] | None

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def rows(self, indices: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(input_ids, loss_mask) of each index, in the order given."""
        import pyarrow.compute as pc

        picked = self.table.with_format("arrow")[list(indices)]
        out: list[tuple[np.ndarray, np.ndarray]] = []
        columns = [picked.column(name).combine_chunks() for name in REQUIRED_COLUMNS]
        ids_col, mask_col = columns
        ids_flat = pc.list_flatten(ids_col).to_numpy(zero_copy_only=False)
        mask_flat = pc.list_flatten(mask_col).to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False)
        start = 0
        for n in lengths.tolist():
            out.append((ids_flat[start : start + n], mask_flat[start : start + n]))
            start += n
        return out


def load_dataset_dir(path: str | Path) -> TokenDataset:
    """Open `path` (written by `dflash-train prepare` or any `save_to_disk` with the same
    columns). Raises DatasetError naming the problem: missing directory, missing column,
    unreadable or inconsistent shard."""
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    root = Path(path).expanduser()
    if not root.is_dir():
        raise DatasetError(f"data dir {root}: not a directory")
    if not (root / "state.json").is_file():
        raise DatasetError(
            f"data dir {root}: no state.json (not a dataset written by save_to_disk / prepare)"
        )
    try:
        ds = datasets.load_from_disk(str(root))
    except FileNotFoundError as exc:
        raise DatasetError(f"data dir {root}: missing file {exc.filename or exc}") from None
    except (OSError, ValueError, pa.ArrowException, KeyError) as exc:
        raise DatasetError(f"data dir {root}: {_describe_bad_shard(root, exc)}") from None
    if isinstance(ds, datasets.DatasetDict):
        raise DatasetError(
            f"data dir {root}: holds splits {sorted(ds)}; point at one split's directory"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise DatasetError(
            f"data dir {root}: missing column(s) {', '.join(missing)} "
            f"(has {', '.join(ds.column_names) or 'none'})"
        )
    if len(ds) == 0:
        raise DatasetError(f"data dir {root}: holds no samples")
    try:
        ds.data.table.validate(full=True)
        ids = ds.data.column("input_ids")
        mask = ds.data.column("loss_mask")
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        mask_lengths = pc.list_value_length(mask).to_numpy(zero_copy_only=False)
        loss_tokens = pc.sum(pc.list_flatten(mask)).as_py() or 0
        mask_range = pc.min_max(pc.list_flatten(mask)).as_py()
        max_token_id = pc.max(pc.list_flatten(ids)).as_py()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetError(f"data dir {root}: corrupt shard: {_one_line(exc)}") from None
    bad = np.flatnonzero(lengths != mask_lengths)
    if bad.size:
        raise DatasetError(
            f"data dir {root}: sample {int(bad[0])} has {int(lengths[bad[0]])} input_ids but "
            f"{int(mask_lengths[bad[0]])} loss_mask values"
        )
    if mask_range["min"] is not None and (mask_range["min"] < 0 or mask_range["max"] > 1):
        raise DatasetError(f"data dir {root}: loss_mask holds values other than 0 and 1")
    if lengths.min() == 0:
        raise DatasetError(f"data dir {root}: sample {int(np.argmin(lengths))} is empty")
    stats = DatasetStats(
        samples=len(ds),
        tokens=int(lengths.sum()),
        loss_tokens=int(loss_tokens),
        min_length=int(lengths.min()),
        max_length=int(lengths.max()),
        mean_length=float(lengths.mean()),
        max_token_id=int(max_token_id),
    )
    log.info("%d samples loaded from %s (%d tokens)", stats.samples, root, stats.tokens)
    return TokenDataset(root, ds, lengths, stats, _read_prepare_info(root))


def _read_prepare_info(root: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((root / "prepare.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _describe_bad_shard(root: Path, exc: BaseException) -> str:
    """Name the first shard that does not open on its own, if one can be found."""
    import pyarrow as pa

    try:
        state = json.loads((root / "state.json").read_text(encoding="utf-8"))
        files = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return f"unreadable state.json: {_one_line(exc)}"
    for name in files:
        try:
            with pa.memory_map(str(root / name)) as source:
                pa.ipc.open_stream(source).read_all()
        except (pa.ArrowException, OSError) as shard_exc:
            return f"corrupt shard {name}: {_one_line(shard_exc)}"
    return f"cannot open: {_one_line(exc)}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What prepare.json records of the tokenizer that wrote the ids: two datasets with
    the same fingerprint can be trained on together."""
    vocab = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return {"vocab_size": len(vocab), "sha256": digest[:16]}


def split_weight(spec: str) -> tuple[str, int]:
    path, weight = spec_parts(spec)
    if weight < 1:
        raise DatasetError(f"data dir {spec}: *K needs K of at least 1")
    return path, weight


def load_data_dirs(specs: str | Sequence[str]) -> TokenDataset:
    """One dataset of several prepared dirs (train's repeated --data-dir), each `DIR*K`
    taken K times, after one check that every dir's ids come from the same tokenizer."""
    import datasets

    specs = data_dir_specs(specs)
    parts = [(load_dataset_dir(path), weight) for path, weight in map(split_weight, specs)]
    if len(parts) == 1 and parts[0][1] == 1:
        return parts[0][0]
    _check_one_tokenizer([ds for ds, _ in parts])
    chosen = [ds for ds, weight in parts for _ in range(weight)]
    lengths = np.concatenate([ds.lengths for ds in chosen])
    table = datasets.concatenate_datasets([ds.table for ds in chosen])
    stats = DatasetStats(
        samples=int(lengths.shape[0]),
        tokens=int(lengths.sum()),
        loss_tokens=sum(ds.stats.loss_tokens for ds in chosen),
        min_length=int(lengths.min()),
        max_length=int(lengths.max()),
        mean_length=float(lengths.mean()),
        max_token_id=max(ds.stats.max_token_id for ds in chosen),
    )
    sources = [
        {"path": str(ds.path), "weight": weight, "samples": len(ds), "prepare": ds.prepare_info}
        for ds, weight in parts
    ]
    return TokenDataset(parts[0][0].path, table, lengths, stats, {"sources": sources})


def _check_one_tokenizer(parts: Sequence[TokenDataset]) -> None:
    """Every dir whose prepare.json names its tokenizer names the same one."""
    known = [
        (ds, (ds.prepare_info or {}).get("tokenizer"))
        for ds in parts
        if isinstance((ds.prepare_info or {}).get("tokenizer"), dict)
    ]
    for ds, fingerprint in known[1:]:
        first, theirs = known[0]
        if fingerprint != theirs:
            raise DatasetError(
                f"data dir {ds.path}: prepared with another tokenizer than {first.path} "
                f"(vocab {fingerprint.get('vocab_size')} vs {theirs.get('vocab_size')}, "
                f"sha256 {fingerprint.get('sha256')} vs {theirs.get('sha256')})"
            )
