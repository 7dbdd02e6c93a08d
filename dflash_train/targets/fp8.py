"""`--target-dtype fp8`: the frozen target's decoder linears in float8 (torchao, e4m3,
dynamic rowwise scales for activations and weights). The target only runs forward, so no
gradient ever meets the quantised weights. Opt-in: it changes the hidden states the drafter
learns from (docs/performance.md gives the measured fidelity); use it when the target is
served in FP8 anyway, so the drafter trains on what it will see at inference."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dflash_train.targets.frozen_target import Target

TARGET_DTYPES = ("bf16", "fp8")
# torchao's float8 matmuls (torch._scaled_mm) need Ada or Hopper: compute capability 8.9+.
MIN_CAPABILITY = (8, 9)
# _scaled_mm wants both matrix sizes divisible by 16; smaller linears stay in bf16.
ALIGN = 16
# What torchao's quantize_ sets for the whole process by default (set_inductor_config), given
# to the fp8 target's own compile instead (compile_target_layers). Process-wide, it made every
# later compile tune each Triton kernel: an fp8 launch on an H100 was still compiling the
# drafter's layers 485 s in (bench/results/target_stage_h100_2026-12-05). torchao also set
# float32 matmuls to TF32 for the whole process; nothing here wants that.
TARGET_INDUCTOR_OPTIONS = {
    "coordinate_descent_tuning": True,
    "coordinate_descent_check_all_directions": True,
}


def off_cuda_refusal(device_type: str) -> str:
    """The one-line refusal for a target off CUDA (torchao asserts the same)."""
    major, minor = MIN_CAPABILITY
    return (
        f"target_dtype (--target-dtype): fp8 needs a CUDA GPU of compute capability "
        f"{major}.{minor}+ (torchao float8 matmuls); the target is on {device_type}"
    )


def fp8_refusal(device: torch.device) -> str | None:
    """Why fp8 cannot run on `device` (one line), or None where it can."""
    if device.type != "cuda":
        return off_cuda_refusal(device.type)
    import torch

    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        major, minor = MIN_CAPABILITY
        return (
            f"target_dtype (--target-dtype): fp8 needs compute capability {major}.{minor}+; "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )
    try:
        import torchao  # noqa: F401
    except ImportError:
        return "target_dtype (--target-dtype): fp8 needs torchao (pip install 'dflash[fp8]')"
    return None


def _quantisable(module: nn.Module, _name: str) -> bool:
    from torch import nn

    return (
        isinstance(module, nn.Linear)
        and module.in_features % ALIGN == 0
        and module.out_features % ALIGN == 0
    )


def quantise_target_fp8(target: Target) -> int:
    """Quantise the linears of the target's decoder layers in place (the embedding and
    lm_head, which the drafter shares, stay as they are). Returns how many were converted.
    Raises ValueError with a one-line reason where fp8 cannot run."""
    reason = fp8_refusal(target.device)
    if reason is not None:
        raise ValueError(reason)
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        PerRow,
        quantize_,
    )

    count = sum(_quantisable(m, "") for m in target.layers.modules())
    config = Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow(), set_inductor_config=False
    )
    quantize_(target.layers, config, filter_fn=_quantisable)
    return count


def is_fp8(target: Target) -> bool:
    """Whether quantise_target_fp8 converted this target's linears (torchao's Float8Tensor
    weights)."""
    return any(
        type(getattr(module, "weight", None)).__name__.startswith("Float8")
        for module in target.layers.modules()
    )
