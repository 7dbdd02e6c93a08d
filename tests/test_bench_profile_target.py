"""bench/profile_target.py runs where CI runs (`--device cpu --smoke`: tiny-hybrid, eager), so
the GPU profile of the target stage does not rot between device sessions; its categories
are checked on the kernel names and launch contexts an H100 trace of the compiled hybrid
has, since no GPU runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_profile_target_cpu_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from profile_target import CATEGORIES

    argv = [
        sys.executable, "bench/profile_target.py", "--device", "cpu", "--smoke", "--steps", "2",
        "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'bench'}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "profile_target_fp32_eager.json").read_text())
    assert result["target"] == "random:tiny-hybrid" and result["compiled"] is False
    assert result["steps_profiled"] == 2 and result["graphs_compiled_while_profiled"] == 0
    cats = result["categories"]
    assert list(cats) == list(CATEGORIES)
    total = result["kernel_ms_per_step"]
    assert total > 0 and abs(sum(c["ms"] for c in cats.values()) - total) <= 0.001 * len(cats)
    # The reference kernels' ops run inside the opaque ops, so they count as theirs, and the
    # projections and the full-attention layers as matmul and attention.
    for cat in ("matmul", "attention", "gated_delta_rule", "conv1d"):
        assert cats[cat]["ms"] > 0, cat
    assert cats["fp8_scaling"]["ms"] == 0
    inside = [k for k in result["top_kernels"] if k["category"] == "gated_delta_rule"]
    assert any(k["name"] == "aten::bmm" for k in inside)  # a matmul, but the kernel's
    assert result["useful_flops_per_step"] > 0 and "GFLOP/token" in result["flop_count"]
    assert (tmp_path / result["trace"]).exists()
    assert "gated_delta_rule" in done.stdout and "idle" in done.stdout


def test_profile_target_cpu_smoke_of_the_fp8_path(tmp_path: Path) -> None:
    """torchao's quantisation on the CPU with its hardware check lifted: the fp8 case's
    plumbing (quantise, opaque kernels, profile) runs before a GPU spends minutes on it."""
    argv = [
        sys.executable, "bench/profile_target.py", "--device", "cpu", "--smoke", "--fp8",
        "--allow-cpu-fp8", "--steps", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'bench'}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "profile_target_fp8_eager.json").read_text())
    assert result["target_dtype"] == "fp8" and result["fp8_linears"] > 0
    cats = result["categories"]
    assert cats["fp8_scaling"]["ms"] > 0 and cats["matmul"]["ms"] > 0
    assert cats["gated_delta_rule"]["ms"] > 0  # the kernels stay behind their opaque ops
    without = [arg for arg in argv if arg != "--allow-cpu-fp8"]
    refused = subprocess.run(without, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "--fp8: torchao's float8 matmuls need a CUDA GPU" in refused.stderr


def _kernel(
    name: str, context: str = "", launcher: str = "", cat: str = "kernel"
) -> tuple[str, str, str, str]:
    return name, context.lower(), launcher, cat


COMPILED = "torch-compiled region: 1/0 / compiledfxgraph"


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (_kernel("chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
                 f"{COMPILED} / dflash::chunk_gated_delta_rule"), "gated_delta_rule"),
        # fla's own matmuls inside the kernel are the kernel's, not the projections'
        (_kernel("nvjet_tst_128x64_64x8_1x1_v_bz_TNT",
                 f"{COMPILED} / dflash::chunk_gated_delta_rule / aten::mm", "aten::mm"),
         "gated_delta_rule"),
        (_kernel("causal_conv1d_fwd_kernel", f"{COMPILED} / dflash::causal_conv1d"), "conv1d"),
        (_kernel("nvjet_tst_256x128_64x4_1x2_h_bz_NNT", COMPILED, "aten::mm"), "matmul"),
        (_kernel("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128",
                 COMPILED, "aten::_scaled_mm"), "matmul"),
        (_kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<256>>",
                 COMPILED, "aten::_flash_attention_forward"), "attention"),
        # cuDNN's (an H100's full-attention layers): "wgmma" in the name, yet attention
        (_kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x256",
                 COMPILED, "aten::_cudnn_attention_forward"), "attention"),
        (_kernel("triton_red_fused_abs_amax_clamp_0", COMPILED), "fp8_scaling"),
        (_kernel("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_2", COMPILED), "norm"),
        (_kernel("triton_poi_fused_mul_silu_3", COMPILED), "elementwise"),
        (_kernel("Memcpy DtoD (Device -> Device)", cat="gpu_memcpy"), "memcpy_memset"),
        (_kernel("void at::native::sbtopk::gatherTopK<float>", "aten::topk", "aten::topk"),
         "other"),
    ],
)  # fmt: skip
def test_target_kernels_fall_in_their_categories(
    item: tuple[str, str, str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from profile_drafter import Item
    from profile_target import categorise

    name, context, launcher, cat = item
    assert categorise(Item(name, 10.0, 0.0, 10.0, context, launcher, cat)) == expected
