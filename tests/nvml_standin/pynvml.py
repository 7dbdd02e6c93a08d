"""A stand-in for nvidia-ml-py for processes started by tests (no GPU here): put this
directory on PYTHONPATH and `dflash-train gpus` reads two fixed H200s. The processes said
to hold GPU 0 are the pids in $NVML_STANDIN_PIDS (comma-separated, or `@FILE` naming a
file of them), 8 GiB each."""

from __future__ import annotations

import os
import types
from pathlib import Path

NVML_TEMPERATURE_GPU = 0
_MIB = 1024 * 1024


class NVMLError(Exception):
    pass


def nvmlInit() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetName(handle: int) -> bytes:
    return b"NVIDIA H200"


def nvmlDeviceGetEnforcedPowerLimit(handle: int) -> int:
    return 700_000


def nvmlDeviceGetUtilizationRates(handle: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(gpu=0 if handle else 100)  # a spinning kernel keeps it at 100


def nvmlDeviceGetMemoryInfo(handle: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(used=(0 if handle else 8192) * _MIB, total=143771 * _MIB)


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return 90_000 if handle else 655_000


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return 31 if handle else 66


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[types.SimpleNamespace]:
    if handle:
        return []
    given = os.environ.get("NVML_STANDIN_PIDS", "")
    if given.startswith("@"):  # a file of pids, read at every sample (a run started later)
        try:
            given = Path(given[1:]).read_text(encoding="utf-8")
        except OSError:
            given = ""
    pids = [int(p) for p in given.replace(",", " ").split()]
    return [types.SimpleNamespace(pid=pid, usedGpuMemory=8192 * _MIB) for pid in pids]
