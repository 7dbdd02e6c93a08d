"""Which implementation each layer type of a target runs, and the fast causal conv1d for
hybrid (Gated-DeltaNet) targets.

transformers picks the linear-attention kernels once, when its modeling module is imported:
flash-linear-attention (`fla`) for the gated delta rule, the `causal-conv1d` package for the
short convolution, else a pure-PyTorch reference for each. `causal-conv1d` is a CUDA
extension with no wheel on the package index, so where it is missing and `fla` is there,
`use_fast_conv1d` swaps in fla's Triton short convolution (same arithmetic). The report
(`layer_paths`) goes into run_start, and `fallback_warning` into a warning event, so a run on
the slow reference never goes unnoticed again. Before the layers compile, `make_kernels_opaque`
puts both kernels behind custom ops (kernel_ops.py), whichever implementation each runs."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dflash_train.targets.frozen_target import Target

TORCH = "torch"  # the pure-PyTorch reference
FLA_TRITON = "fla_triton"
# The modeling module's global for each part, and the package transformers looks for.
PARTS = {
    "gated_delta_rule": ("torch_chunk_gated_delta_rule", "fla"),
    "conv1d": ("causal_conv1d_fn", "causal_conv1d"),
}
INSTALL_HINT = "pip install 'dflash[hybrid]' (flash-linear-attention) on a CUDA box"


def layer_types(model: nn.Module) -> list[str]:
    """The config's layer types in order; a model without them is all full attention."""
    config = getattr(model, "config", None)
    types = getattr(config, "layer_types", None) or []
    return list(types) or ["full_attention"] * int(getattr(config, "num_hidden_layers", 1))


def _linear_attention_module(model: nn.Module) -> ModuleType | None:
    """The modeling module of the model's Gated-DeltaNet layers (its globals are the kernels)."""
    for layer in model.get_decoder().layers:
        mixer = getattr(layer, "linear_attn", None)
        if mixer is not None:
            return sys.modules.get(type(mixer).__module__)
    return None


def _kernel_function(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function behind a module global. With the `kernels` package installed (transformers
    5.25 requires it), each kernel function listed in `use_kernelized_func` is an instance of a
    one-off `nn.Module` whose forward calls transformers' wrapper from its closure, so that
    `kernelize` can swap it; without it, the global is the wrapper itself."""
    forward = getattr(type(function), "forward", None)
    if forward is None or not inspect.isfunction(forward):
        return function
    try:
        inner = inspect.getclosurevars(forward).nonlocals.get("func")
    except (TypeError, ValueError):
        return function
    return inner if callable(inner) else function


def _implementation(function: Callable[..., Any]) -> str:
    """The package a transformers kernel wrapper dispatches to, or TORCH for its reference;
    through the opaque ops' wrappers (kernel_ops.py) to the function they call."""
    function = _kernel_function(function)
    replaced = getattr(function, "replaced", None)
    if replaced is not None:
        return _implementation(replaced)
    if getattr(function, "_dflash_fast_conv1d", False):
        return FLA_TRITON
    try:
        outer = inspect.getclosurevars(function).nonlocals
    except (TypeError, ValueError):  # not a plain Python function: a kernel of its own
        return getattr(function, "__module__", None) or "unknown"
    if outer.get("is_new_implementation"):
        return str(outer.get("package", "package"))
    return TORCH


def layer_paths(target: Target) -> dict[str, dict[str, str]]:
    """Per layer type, which implementation each of its parts runs on the target's device:
    {"full_attention": {"attention": "sdpa"}, "linear_attention": {"gated_delta_rule": "fla",
    "conv1d": "fla_triton"}}. Kernels need CUDA: on another device the reference runs."""
    model = target.model
    types = layer_types(model)
    attention = str(getattr(model.config, "_attn_implementation", None) or "eager")
    paths: dict[str, dict[str, str]] = {}
    if "full_attention" in types:
        paths["full_attention"] = {"attention": attention}
    if "linear_attention" in types:
        module = _linear_attention_module(model)
        on_cuda = target.device.type == "cuda"
        parts = {}
        for part, (name, _) in PARTS.items():
            function = getattr(module, name, None) if module is not None else None
            found = _implementation(function) if function is not None else TORCH
            parts[part] = found if on_cuda else TORCH
        paths["linear_attention"] = parts
    return paths


def fallback_warning(paths: dict[str, dict[str, str]]) -> str | None:
    """A one-line warning naming the layer parts that run the slow reference, else None."""
    slow = [f"{kind}.{part}" for kind, parts in paths.items() for part, impl in parts.items()
            if impl == TORCH]  # fmt: skip
    if not slow:
        return None
    return (
        f"target layers run the pure-PyTorch fallback for {', '.join(slow)} (correct but much "
        f"slower than the fused kernels; {INSTALL_HINT})"
    )


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def _fla_conv1d(reference: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' causal_conv1d_fn ([B, D, T] in and out) on fla's Triton kernel ([B, T, D]);
    tensors off CUDA take the reference."""
    from fla.modules.causal_conv1d import causal_conv1d

    def fast_conv1d(
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if not hidden_states.is_cuda:
            return reference(hidden_states, weight, bias, activation=activation, **kwargs)
        # The layer hands a transposed view of a [B, T, D] tensor: transposing back is free.
        out, _ = causal_conv1d(
            hidden_states.transpose(1, 2), weight=weight, bias=bias, activation=activation,
            backend="triton",
        )  # fmt: skip
        return out.transpose(1, 2)

    import torch

    # Never traced: compile_target_layers puts it behind an opaque op (kernel_ops.py); where
    # something else compiles the model, a graph break is better than tracing the Triton kernel.
    wrapped = torch.compiler.disable(fast_conv1d)
    wrapped._dflash_fast_conv1d = True  # type: ignore[attr-defined]
    wrapped.reference = reference  # type: ignore[attr-defined]
    return wrapped


def use_fast_conv1d(model: nn.Module) -> bool:
    """Route a hybrid model's short convolution through fla's Triton kernel where
    transformers fell back to the reference and fla is installed. True when it did."""
    module = _linear_attention_module(model)
    if module is None or not fla_available():
        return False
    name = PARTS["conv1d"][0]
    current = getattr(module, name, None)
    if current is None or _implementation(current) != TORCH:
        return False
    setattr(module, name, _fla_conv1d(_kernel_function(current)))
    return True


def make_kernels_opaque(model: nn.Module) -> bool:
    """Route a hybrid model's linear-attention kernels, whichever implementation each runs,
    through kernel_ops' custom ops, so that a compiled layer neither traces nor breaks around
    them (kernel_ops.py says why). Idempotent; False for a model without such layers."""
    module = _linear_attention_module(model)
    if module is None:
        return False
    from dflash_train.targets.kernel_ops import OPAQUE

    for part, (name, _) in PARTS.items():
        current = _kernel_function(getattr(module, name))
        if getattr(current, "replaced", None) is None:
            setattr(module, name, OPAQUE[part](current))
    return True


COMPILED_LAYER = "whole layer"
COMPILED_HYBRID_LAYER = "whole layer; gated_delta_rule and conv1d as opaque ops, not traced"


def compiled_parts(model: nn.Module) -> dict[str, str]:
    """What compile_target_layers puts in the compiled graph of each layer type (run_start
    reports it beside layer_paths)."""
    types = layer_types(model)
    parts = {}
    if "full_attention" in types:
        parts["full_attention"] = COMPILED_LAYER
    if "linear_attention" in types:
        parts["linear_attention"] = COMPILED_HYBRID_LAYER
    return parts


def use_reference_kernels(model: nn.Module) -> None:
    """Every linear-attention part back on the pure-PyTorch reference (the benchmark's
    fallback case): the functions transformers wrapped keep it as `__wrapped__`."""
    module = _linear_attention_module(model)
    if module is None:
        return
    for name, _ in PARTS.values():
        function = _kernel_function(getattr(module, name))
        while getattr(function, "replaced", None) is not None:  # an opaque op's wrapper
            function = _kernel_function(function.replaced)  # type: ignore[attr-defined]
        reference = getattr(function, "reference", None) or getattr(function, "__wrapped__", None)
        if reference is not None:
            setattr(module, name, _keyword_filter(reference))


def _keyword_filter(reference: Callable[..., Any]) -> Callable[..., Any]:
    """The reference called as transformers' wrapper calls it: unknown keywords dropped."""
    accepted = set(inspect.signature(reference).parameters)

    def call(*args: Any, **kwargs: Any) -> Any:
        return reference(*args, **{k: v for k, v in kwargs.items() if k in accepted})

    call.reference = reference  # type: ignore[attr-defined]
    return call
