"""GPU telemetry: the real no-NVML path (this machine has no driver), and the NVML path
with pynvml replaced by a fake module (the one mock the suite accepts: no GPU here)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_harness import cli, decode_all, dflash_argv

from dflash_train import gpu_telemetry
from dflash_train.control.preflight import PreflightError, check_gpus


class FakeNvmlError(Exception):
    pass


def fake_pynvml(devices: list[dict[str, Any]], calls: dict[str, int]) -> types.ModuleType:
    """A stand-in for nvidia-ml-py with the calls gpu_telemetry makes, counting them."""
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNvmlError  # type: ignore[attr-defined]
    module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return fn(*args)

        return wrapper

    def supported(handle: dict[str, Any], key: str) -> Any:
        value = handle[key]
        if value is None:
            raise FakeNvmlError("Not Supported")
        return value

    functions = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": lambda i: devices[i],
        "nvmlDeviceGetName": lambda h: h["name"].encode(),
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: supported(h, "limit_mw"),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=h["util"]),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            used=h["used"], total=h["total"]
        ),
        "nvmlDeviceGetPowerUsage": lambda h: supported(h, "power_mw"),
        "nvmlDeviceGetTemperature": lambda h, sensor: h["temp"],
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in h["procs"]
        ],
    }
    for name, fn in functions.items():
        setattr(module, name, counted(name, fn))
    return module


MIB = 1024 * 1024
DEVICES = [
    {
        "name": "NVIDIA H200",
        "util": 87,
        "used": 1000 * MIB,
        "total": 143771 * MIB,
        "power_mw": 412_345,
        "limit_mw": 700_000,
        "temp": 61,
        "procs": [(4242, 900 * MIB)],
    },
    {
        "name": "NVIDIA H200",
        "util": 0,
        "used": 0,
        "total": 143771 * MIB,
        "power_mw": None,  # not supported on this board: reads as null, not an error
        "limit_mw": None,
        "temp": 30,
        "procs": [],
    },
]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    calls: dict[str, int] = {}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(DEVICES, calls))
    monkeypatch.setattr(gpu_telemetry, "_SESSION", gpu_telemetry._Nvml())
    yield calls


def test_readings_units_roles_and_processes(nvml: dict[str, int]) -> None:
    sample = gpu_telemetry.sample_gpus({1: "drafter"})
    assert sample["available"] is True and sample["reason"] is None
    first, second = sample["gpus"]
    assert first == {
        "index": 0,
        "name": "NVIDIA H200",
        "role": "",
        "util": 87.0,
        "mem_used": 1000.0,
        "mem_total": 143771.0,
        "power_w": 412.3,
        "power_limit_w": 700.0,
        "temp_c": 61.0,
        "processes": [{"pid": 4242, "name": gpu_telemetry.process_name(4242), "gpu_mem": 900.0}],
    }
    assert second["role"] == "drafter"
    assert second["power_w"] is None and second["power_limit_w"] is None
    assert second["processes"] == []


def test_nvml_is_initialised_once_and_handles_are_cached(nvml: dict[str, int]) -> None:
    for _ in range(5):
        gpu_telemetry.sample_gpus()
    assert nvml["nvmlInit"] == 1
    assert nvml["nvmlDeviceGetHandleByIndex"] == 2
    assert nvml["nvmlDeviceGetName"] == 2
    assert nvml["nvmlDeviceGetUtilizationRates"] == 10


def test_preflight_gpu_checks_against_nvml(nvml: dict[str, int]) -> None:
    check_gpus([1], allow_busy=False)
    with pytest.raises(PreflightError) as busy:
        check_gpus([0, 1], allow_busy=False)
    assert busy.value.code == "gpu_busy" and "GPU 0: pid 4242" in busy.value.message
    assert "0.9 GiB" in busy.value.message  # how much of the GPU the holder takes
    check_gpus([0], allow_busy=True)
    with pytest.raises(PreflightError) as missing:
        check_gpus([1, 5], allow_busy=True)
    assert missing.value.code == "gpu_missing" and "GPU 5" in missing.value.message


def test_a_holding_process_is_named() -> None:
    me = gpu_telemetry.process_name(os.getpid())
    assert me and me == Path("/proc/self/comm").read_text().strip()
    assert gpu_telemetry.process_name(2**22 + 12345) is None  # above pid_max: never a process


def test_without_nvml_the_reply_says_so() -> None:
    rc, reply = cli("gpus")
    assert rc == 0 and reply.ok
    assert reply.data["available"] is False and reply.data["gpus"] == []
    assert "NVML" in reply.data["reason"]


def test_gpus_follow_streams_gpu_lines_until_the_reader_goes() -> None:
    proc = subprocess.Popen(
        dflash_argv("gpus", "--follow", "--interval", "0.1"), stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        lines = decode_all(proc.stdout.readline() + proc.stdout.readline())
        assert [line.kind for line in lines] == ["gpu", "gpu"]
        assert [line.seq for line in lines] == [0, 1]
        assert lines[0]["available"] is False
        proc.stdout.close()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
