"""Which kernel each target layer type runs (targets/linear_attention.py), reported in
run_start and, for a run on the pure-PyTorch fallback, in a warning event; `--target-dtype
fp8` refused on the CPU in one line. On the CPU the hybrid's linear-attention layers run
transformers' reference (fla and causal-conv1d are CUDA kernels and not installed here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_process import run_train, status_lines, train_argv

from dflash_train.targets import frozen_target as targets
from dflash_train.targets import linear_attention as la
from dflash_train.targets.fp8 import fp8_refusal, quantise_target_fp8

HYBRID = "random:tiny-hybrid"
CPU_FALLBACK = {
    "full_attention": {"attention": "sdpa"},
    "linear_attention": {"gated_delta_rule": "torch", "conv1d": "torch"},
}


@pytest.fixture(scope="module")
def hybrid() -> targets.Target:
    return targets.load_target(HYBRID, "cpu", torch.float32)


def test_a_hybrid_on_the_cpu_reports_the_reference_for_both_parts(
    hybrid: targets.Target, tiny_target: targets.Target
) -> None:
    assert la.layer_paths(hybrid) == CPU_FALLBACK
    warning = la.fallback_warning(la.layer_paths(hybrid))
    assert warning is not None and "\n" not in warning
    assert "linear_attention.gated_delta_rule, linear_attention.conv1d" in warning
    assert "flash-linear-attention" in warning
    # A dense target has one layer type, on SDPA: nothing to warn about.
    assert la.layer_paths(tiny_target) == {"full_attention": {"attention": "sdpa"}}
    assert la.fallback_warning(la.layer_paths(tiny_target)) is None
    # No fla here: the conv stays on transformers' reference, whatever the device.
    assert not la.fla_available() and not la.use_fast_conv1d(hybrid.model)
    # The device-blind reading (what a CUDA run reports) reaches transformers' wrapper, also
    # through the nn.Module that the `kernels` package makes of each function.
    module = la._linear_attention_module(hybrid.model)
    for name, _ in la.PARTS.values():
        assert la._implementation(getattr(module, name)) == la.TORCH, name


def test_the_reference_kernels_compute_what_transformers_shipped(hybrid: targets.Target) -> None:
    """The benchmark's fallback case swaps in the unwrapped reference functions: same
    hidden states as the functions transformers chose (here: the same reference)."""
    module = la._linear_attention_module(hybrid.model)
    assert module is not None
    names = [name for name, _ in la.PARTS.values()]
    shipped = {name: getattr(module, name) for name in names}
    ids = torch.randint(0, hybrid.vocab_size, (2, 19), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    before = targets.extract_context(hybrid, ids, mask, [1, 4])
    try:
        la.use_reference_kernels(hybrid.model)
        assert all(getattr(module, name) is not shipped[name] for name in names)
        assert la.layer_paths(hybrid) == CPU_FALLBACK
        after = targets.extract_context(hybrid, ids, mask, [1, 4])
    finally:
        for name in names:
            setattr(module, name, shipped[name])
    torch.testing.assert_close(after, before)


def test_fp8_is_refused_off_cuda(hybrid: targets.Target) -> None:
    reason = fp8_refusal(torch.device("cpu"))
    assert reason is not None and "compute capability 8.9+" in reason and "cpu" in reason
    with pytest.raises(ValueError, match="the target is on cpu"):
        quantise_target_fp8(hybrid)


def test_train_on_a_hybrid_says_which_path_each_layer_type_runs(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    argv = train_argv(HYBRID, prepared_data_dir, run_dir, "--pipeline", "sync", "--max-steps", "1")
    done = run_train(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = status_lines(run_dir)
    start = next(line for line in lines if line.kind == "run_start")
    assert start["kernels"]["target_layer_paths"] == CPU_FALLBACK
    assert start["kernels"]["target_dtype"] == "bf16"
    warnings = [line for line in lines if line.kind == "event" and line["level"] == "warning"]
    fallback = [line for line in warnings if line["code"] == "target_fallback"]
    assert len(fallback) == 1 and fallback[0].seq == start.seq + 1
    assert "linear_attention.gated_delta_rule" in fallback[0]["message"]
    assert "warning: target layers run the pure-PyTorch fallback" in done.stderr
    assert lines[-1]["reason"] == "completed"


def test_fp8_on_the_cpu_is_refused_in_one_line(tmp_path: Path, prepared_data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    argv = train_argv("smollm2", prepared_data_dir, run_dir, "--target-dtype", "fp8")
    done = run_train(argv, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dflash-train train: target_dtype (--target-dtype): fp8 needs a CUDA GPU of compute "
        "capability 8.9+ (torchao float8 matmuls); the target is on cpu"
    ]
    assert not (run_dir / "status.jsonl").exists()
    done = run_train([*argv[:-1], "fp16"], timeout=60)
    assert done.returncode == 2 and "target_dtype" in done.stderr and "fp16" in done.stderr


def test_an_explicit_liger_loss_on_the_cpu_is_refused_in_one_line(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    """auto runs Liger's loss kernel where it can and inductor's elsewhere; asking for liger
    where it cannot run stops the run before anything loads."""
    run_dir = tmp_path / "run"
    done = run_train(train_argv("smollm2", prepared_data_dir, run_dir, "--ce-kernel", "liger"))
    assert done.returncode == 1  # found when the drafter's device is known, as a GPU's fp8 is
    assert done.stderr.strip().splitlines() == [
        "dflash-train train: ce_kernel (--ce-kernel): liger runs on a GPU; the drafter is on cpu"
    ]
    # The stream, all a console has, ends with the reason.
    (end,) = status_lines(run_dir)
    assert end.kind == "run_end" and end["reason"] == "error"
    assert end["error_tail"].endswith("liger runs on a GPU; the drafter is on cpu")


def test_fp8_leaves_the_process_compile_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchao's quantize_ turns on inductor's coordinate-descent tuning and TF32 float32
    matmuls for the whole process unless told not to: every later compile (the drafter's
    layers, flex, the loss) then tuned each Triton kernel, and an fp8 launch on an H100 was
    still compiling 485 s in. quantise_target_fp8 leaves both as they were and gives the
    tuning to the fp8 target's own compile. torchao's hardware check is lifted (no GPU
    here); the quantisation itself is torchao's."""
    import torch._inductor.config as inductor_config
    import torchao.quantization.quant_api as quant_api

    from dflash_train.pipeline.target_workers import (
        compile_target_layers,
        uncompile_target_layers,
    )
    from dflash_train.targets import fp8

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda *_: None)
    monkeypatch.setattr(fp8, "fp8_refusal", lambda _device: None)
    # Restored after the test whatever it does to them.
    for name in ("coordinate_descent_tuning", "coordinate_descent_check_all_directions"):
        monkeypatch.setattr(inductor_config, name, False)
    precision = torch.get_float32_matmul_precision()
    target = targets.load_target("random:tiny", "cpu", torch.bfloat16)
    try:
        assert not fp8.is_fp8(target)
        assert quantise_target_fp8(target) > 0 and fp8.is_fp8(target)
        assert not inductor_config.coordinate_descent_tuning
        assert not inductor_config.coordinate_descent_check_all_directions
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(precision)
    options: list[object] = []
    real_compile = torch.compile

    def compile_seen(fn: object, **kwargs: object) -> object:
        options.append(kwargs.get("options"))
        return real_compile(fn, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_seen)
    assert compile_target_layers(target, [1]) == 2
    uncompile_target_layers(target)
    assert options == [fp8.TARGET_INDUCTOR_OPTIONS] * 2
    compile_target_layers(targets.load_target("random:tiny", "cpu", torch.bfloat16), [1])
    assert options[2:] == [None, None]  # a bf16 target's compile takes inductor's defaults
