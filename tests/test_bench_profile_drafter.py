"""bench/profile_drafter.py runs where CI runs (`--device cpu --smoke`), so the H200 profile
of the drafter step does not rot between device sessions; and its reading of a CUDA trace
(kernels tied to the ops that launched them, backward work to its forward op) is checked
on a hand-written trace in the layout torch.profiler writes, since no GPU runs here."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def test_profile_drafter_cpu_smoke(tmp_path: Path) -> None:
    argv = [
        sys.executable, "bench/profile_drafter.py", "--device", "cpu", "--smoke",
        "--steps", "2", "--out", str(tmp_path), "--tag", "cpu",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = _load(tmp_path / "profile_tiny_cpu.json")
    assert result["trace"].startswith("trace_tiny_cpu.json")
    assert result["shape"]["flex_mode"] is None  # SDPA on the CPU: no flex to tune
    assert result["steps_profiled"] == 2 and result["graphs_compiled_while_profiled"] == 0
    cats = result["categories"]
    assert list(cats) == [
        "matmul", "attention", "loss", "norm", "elementwise", "optimizer", "communication",
        "memcpy_memset", "other",
    ]  # fmt: skip
    total = result["kernel_ms_per_step"]
    assert total > 0 and abs(sum(c["ms"] for c in cats.values()) - total) <= 0.001 * len(cats)
    assert cats["matmul"]["ms"] > 0 and cats["loss"]["ms"] > 0 and cats["attention"]["ms"] > 0
    assert result["busy_ms_per_step"] <= result["profiled_step_ms"]
    assert result["useful_flops_per_step"] > 0 and result["step_ms"] > 0
    assert result["top_kernels"] and result["top_kernels"][0]["calls_per_step"] > 0
    trace = _load(tmp_path / result["trace"])
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])
    assert "matmul" in done.stdout and "idle" in done.stdout


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def _op(
    name: str, ts: float, dur: float, tid: int = 1, seq: int | None = None, dims: Any = None
) -> dict[str, Any]:
    """A cpu_op; `seq`: its autograd sequence number (a backward node, on thread 2, carries
    its forward op's); `dims`: its input shapes, as record_shapes writes them."""
    args: dict[str, Any] = {}
    if seq is not None:
        args |= {"Sequence number": seq, "Fwd thread id": 0 if tid == 1 else 1}
    if dims is not None:
        args["Input Dims"] = dims
    return _x("cpu_op", name, ts, dur, tid, **args)


def _launch(corr: int, ts: float, tid: int = 1) -> dict[str, Any]:
    return _x("cuda_runtime", "cudaLaunchKernel", ts, 1, tid, correlation=corr)


def _kernel(corr: int, name: str, ts: float, dur: float, cat: str = "kernel") -> dict[str, Any]:
    return {**_x(cat, name, ts, dur, 7, correlation=corr), "pid": 0}


CUDA_TRACE = [
    _x("user_annotation", "ProfilerStep#1", 0, 1000),
    _op("aten::linear", 10, 20, seq=5),
    _op("aten::mm", 11, 18, seq=5, dims=[[64, 32], [32, 128]]),
    _launch(1, 12),
    _op("aten::rms_norm", 40, 20, seq=6),
    _op("aten::mul", 41, 5, seq=7, dims=[[64, 32], []]),
    _launch(2, 42),
    _x("user_annotation", "Torch-Compiled Region: 0/0", 60, 20),
    _op("CompiledFunction", 61, 18, seq=8),
    _x("cuda_driver", "cuLaunchKernelEx", 62, 1, correlation=3),
    _x("cuda_driver", "cuLaunchKernelEx", 64, 1, correlation=4),
    _op("_LinearCrossEntropy", 100, 50, seq=9),
    _op("aten::mm", 101, 5),
    _launch(5, 102),
    _x("user_annotation", "Torch-Compiled Region: 1/0", 110, 10),
    _x("cuda_driver", "cuLaunchKernelEx", 111, 1, correlation=6),
    # backward, on the autograd engine's thread
    _op("autograd::engine::evaluate_function: MulBackward0", 200, 20, 2, seq=7),
    _op("aten::mul", 201, 5, 2),
    _launch(7, 202, 2),
    _op("autograd::engine::evaluate_function: CompiledFunctionBackward", 230, 20, 2, seq=8),
    _x("cuda_driver", "cuLaunchKernelEx", 231, 1, 2, correlation=8),
    _x("user_annotation", "Optimizer.step#AdamW.step", 500, 50),
    _op("aten::_fused_adamw_", 501, 40),
    _launch(9, 502),
    _op("aten::copy_", 560, 10),
    _x("cuda_runtime", "cudaMemcpyAsync", 561, 2, correlation=10),
    _op("aten::topk", 580, 10),
    _launch(11, 581),
    _kernel(1, "nvjet_tst_128x256_64x4_2x1_v_bz_TNT", 100, 200),
    _kernel(2, "void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", 300, 10),
    _kernel(3, "triton_tem_fused_flex_attention_0", 310, 100),
    _kernel(4, "triton_per_fused_mul_sum_1", 410, 10),
    _kernel(5, "nvjet_tst_256x128_64x4_1x2_h_bz_NNT", 420, 50),
    _kernel(6, "triton_red_fused__to_copy_argmax_exp_logsumexp_sub_0", 470, 30),
    _kernel(7, "void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", 500, 10),
    _kernel(8, "triton_poi_fused_zeros_2", 510, 10),
    _kernel(9, "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 600, 40),
    _kernel(10, "Memcpy DtoD (Device -> Device)", 640, 10, "gpu_memcpy"),
    _kernel(11, "void at::native::sbtopk::gatherTopK<float>", 645, 15),  # overlaps the copy
]
EXPECTED = {
    1: "matmul", 2: "norm", 3: "attention", 4: "attention", 5: "matmul", 6: "loss",
    7: "norm", 8: "attention", 9: "optimizer", 10: "memcpy_memset", 11: "other",
}  # fmt: skip


def test_cuda_trace_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from profile_drafter import categorise, read_trace, summarise

    kernels, _ops, steps = read_trace(CUDA_TRACE)
    assert steps == [1000]
    by_start = {k.start: categorise(k) for k in kernels}
    starts = {e["args"]["correlation"]: e["ts"] for e in CUDA_TRACE if e["pid"] == 0}
    assert {corr: by_start[ts] for corr, ts in starts.items()} == EXPECTED
    result = summarise(kernels, steps, step_ms=0.9, flops=1e9)
    assert result["kernel_ms_per_step"] == 0.485  # every kernel's time
    assert result["busy_ms_per_step"] == 0.48  # 100..520 and 600..660: the overlap once
    assert result["idle_ms_per_step"] == 0.52  # the 1 ms step less the busy time
    assert result["categories"]["attention"]["ms"] == 0.12  # flex's graph, forward + backward
    assert result["categories"]["norm"]["ms"] == 0.02  # rms_norm's mul and its backward
    top = result["top_kernels"]
    assert (top[0]["name"], top[0]["launched_by"]) == (CUDA_TRACE[-11]["name"], "aten::mm")
    assert (top[1]["category"], top[1]["launched_by"]) == ("attention", "CompiledFunction")
    # Each top kernel says where it was launched, with the launching op's shapes.
    assert top[0]["sites"] == [
        {"at": "aten::linear / aten::mm", "dims": "[[64, 32], [32, 128]]",
         "ms_per_step": 0.2, "calls_per_step": 1.0},
    ]  # fmt: skip
    # One kernel name from two places: the forward's mul and its backward, a site each (the
    # backward's with its forward op's path after "<-").
    mul = next(k for k in top if "MulFunctor" in k["name"])
    assert [(s["at"], s["dims"], s["calls_per_step"]) for s in mul["sites"]] == [
        ("aten::rms_norm / aten::mul", "[[64, 32], []]", 1.0),
        (
            "autograd::engine::evaluate_function: mulbackward0 / aten::mul"
            " <- aten::rms_norm / aten::mul",
            "",
            1.0,
        ),
    ]


def test_compiled_drafter_layers_count_as_norm_and_elementwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drafter's compiled stretches run inside drafter_compile.PROFILER_RANGE: their
    fused kernels are its norms and pointwise work, not flex's compiled graph; their GEMMs
    stay matmul. Backward work carries the forward op's path (read_trace), range included."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from profile_drafter import Item, categorise

    def item(name: str, context: str, launcher: str) -> Item:
        return Item(name, 1.0, 0.0, 1.0, context, launcher, "kernel")

    forward = "profilerstep#1 / drafter_pointwise:qkv / torch-compiled region: 2/0"
    backward = "autograd::engine::evaluate_function: compiledfunctionbackward <- " + forward
    flex = "profilerstep#1 / torch-compiled region: 1/0 / compiledfunction"
    cases = {
        ("triton_red_fused__to_copy_mean_mul_pow_rsqrt_0", forward, "triton_red"): "norm",
        ("triton_poi_fused_add_cat_mul_neg_1", forward, "triton_poi"): "elementwise",
        ("triton_per_fused__to_copy_mul_sum_2", backward, "triton_per"): "elementwise",
        ("nvjet_tst_128x256_64x4_2x1_v_bz_TNT", forward, "aten::mm"): "matmul",
        ("triton_per_fused_mul_sum_1", flex, "triton_per"): "attention",
    }
    assert {key: categorise(item(*key)) for key in cases} == cases
