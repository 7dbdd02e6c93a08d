"""NVML readings of this box's GPUs, shaped as the fields of a `gpu` status line.

The trainer's monitor thread calls `sample_gpus` every tick, so NVML is initialised once per
process and device handles are cached; a machine without NVML answers `available: false`
with the reason instead of raising. Memory is in MiB, power in watts, temperature in °C.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_MIB = 1024 * 1024


class _Nvml:
    """The process-wide NVML session: initialised on first use, its failure remembered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.module: Any = None
        self.error: str | None = None
        self.handles: dict[int, Any] = {}
        self.names: dict[int, str] = {}
        self.limits: dict[int, float | None] = {}
        self.started = False

    def start(self) -> bool:
        if self.started:
            return self.error is None
        self.started = True
        try:
            import pynvml
        except ImportError as exc:
            self.error = f"nvidia-ml-py is not installed ({exc})"
            return False
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            for index in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                self.handles[index] = handle
                self.names[index] = _text(pynvml.nvmlDeviceGetName(handle))
                # The enforced limit changes only when an admin changes it: read it once.
                self.limits[index] = _optional(
                    pynvml, lambda h=handle: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
                )
        except pynvml.NVMLError as exc:
            self.error = f"NVML unavailable: {exc}"
            self.handles.clear()
            return False
        self.module = pynvml
        return True


_SESSION = _Nvml()


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _optional(pynvml: Any, read: Callable[[], Any]) -> Any:
    """One NVML reading, or None where the device does not support it (common for power
    and utilisation on MIG slices and some boards)."""
    try:
        return read()
    except pynvml.NVMLError:
        return None


def process_name(pid: int) -> str | None:
    """The command name of a process on this box, None when it is gone or in another pid
    namespace (NVML reports host pids; a container may not see them)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _processes(pynvml: Any, handle: Any) -> list[dict[str, Any]]:
    found = _optional(pynvml, lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    result = []
    for proc in found or []:
        used = getattr(proc, "usedGpuMemory", None)
        mem = round(used / _MIB, 1) if isinstance(used, int) and used >= 0 else None
        pid = int(proc.pid)
        result.append({"pid": pid, "name": process_name(pid), "gpu_mem": mem})
    return result


def _reading(
    pynvml: Any, index: int, handle: Any, role: str, processes: bool = True
) -> dict[str, Any]:
    util = _optional(pynvml, lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    memory = _optional(pynvml, lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    power_mw = _optional(pynvml, lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    temp = _optional(
        pynvml, lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    )
    return {
        "index": index,
        "name": _SESSION.names.get(index, ""),
        "role": role,
        "util": float(util.gpu) if util is not None else None,
        "mem_used": round(memory.used / _MIB, 1) if memory is not None else None,
        "mem_total": round(memory.total / _MIB, 1) if memory is not None else None,
        "power_w": round(power_mw / 1000.0, 1) if power_mw is not None else None,
        "power_limit_w": _SESSION.limits.get(index),
        "temp_c": float(temp) if temp is not None else None,
        "processes": _processes(pynvml, handle) if processes else [],
    }


def sample_gpus(
    roles: Mapping[int, str] | None = None, *, processes: bool = True
) -> dict[str, Any]:
    """`{"available", "reason", "gpus": [...]}`; `roles` maps a GPU index to its job in the
    run ("target", "drafter"), other GPUs get an empty role. `processes=False` skips the
    per-GPU process list (the slowest NVML query; the trainer's monitor never shows it)."""
    roles = roles or {}
    with _SESSION.lock:
        if not _SESSION.start():
            return {"available": False, "reason": _SESSION.error, "gpus": []}
        pynvml = _SESSION.module
        gpus = [
            _reading(pynvml, index, handle, roles.get(index, ""), processes)
            for index, handle in sorted(_SESSION.handles.items())
        ]
    return {"available": True, "reason": None, "gpus": gpus}
