"""Reads the history rows of an offline W&B run file (run-*.wandb): a LevelDB-style log of
protobuf `Record`s in 32 KiB blocks, after a 7-byte ':W&B' header."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        pending += data[pos : pos + length]
        pos += length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every logged row of the single offline run under `run_dir/wandb`."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for record in _records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
    return rows


def run_record(run_dir: Path, timeout: float = 120.0) -> Any:
    """The `run` record (entity, display name, tags, group) of the single offline run. W&B's
    service process writes the file: on a loaded machine the record can land after the run
    finished in this process (a clean-clone CI found none), so this waits for it."""
    deadline = time.monotonic() + timeout
    while True:
        paths = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(paths) <= 1, paths
        if paths and paths[0].stat().st_size >= 7:  # its header written
            found = [r.run for r in _records(paths[0]) if r.WhichOneof("record_type") == "run"]
            if found:
                return found[0]
        assert time.monotonic() < deadline, f"no run record in {paths} within {timeout} s"
        time.sleep(0.2)
