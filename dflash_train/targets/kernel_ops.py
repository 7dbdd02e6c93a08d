"""A hybrid target's linear-attention kernels (the chunked gated delta rule, the causal conv1d)
as torch custom ops, so that a compiled decoder layer holds each kernel call as one opaque
node: dynamo neither traces into the kernel nor breaks the layer's graph around it.

Why (issue 28): transformers' kernel wrapper runs its torch reference whenever
`torch.compiler.is_exporting()` is true, and dynamo before the fix of pytorch#176347 reads that
call as true under torch.compile. On the H200 (torch 2.11) every compiled Gated-DeltaNet layer
therefore traced the reference instead of fla's kernel, taking its export branch too: the
forward substitution over 63 rows and the scan over S/64 chunks unrolled into ~1,300 fp32 graph
nodes, a new graph for every chunk count, and the compile never finished. On any torch the
reference's chunk loop specialises a traced graph on ceil(S/64). Behind an op, the kernel runs
eagerly, where the wrapper picks fla, and the graph does not depend on the sequence length."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# The kernels the ops call, by the name the op is given (a custom op takes no callables).
_KERNELS: dict[str, Callable[..., Any]] = {}


@torch.library.custom_op(
    "dflash::chunk_gated_delta_rule",
    mutates_args=(),
    schema="(str kernel, Tensor query, Tensor key, Tensor value, Tensor g, Tensor beta, "
    "bool use_qk_l2norm_in_kernel) -> Tensor",
)
def _chunk_gated_delta_rule(
    kernel: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    use_qk_l2norm_in_kernel: bool,
) -> torch.Tensor:
    out, _ = _KERNELS[kernel](
        query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel
    )
    return out.contiguous()


@_chunk_gated_delta_rule.register_fake
def _(kernel: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: Any) -> Any:
    return value.new_empty(value.shape)  # [B, T, HV, V], as fla's and the reference's output


@torch.library.custom_op(
    "dflash::causal_conv1d",
    mutates_args=(),
    schema="(str kernel, Tensor hidden_states, Tensor weight, Tensor? bias, str? activation) "
    "-> Tensor",
)
def _causal_conv1d(
    kernel: str,
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    out = _KERNELS[kernel](hidden_states, weight, bias, activation=activation)
    # [B, D, T] in and out of the kernel; the op returns it as a contiguous [B, T, D], the
    # layout fla's kernel writes (no copy on that path) and one the fake can state.
    return out.transpose(1, 2).contiguous()


@_causal_conv1d.register_fake
def _(kernel: str, hidden_states: torch.Tensor, *_: Any) -> Any:
    rows, channels, length = hidden_states.shape
    return hidden_states.new_empty((rows, length, channels))


def _register(inner: Callable[..., Any]) -> str:
    name = f"{len(_KERNELS)}:{getattr(inner, '__name__', 'kernel')}"
    _KERNELS[name] = inner
    return name


def opaque_gated_delta_rule(inner: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `torch_chunk_gated_delta_rule` through the op. Calls that carry a state
    in or out, or packed sequences (a cache, never the trainer's forward), run `inner` as is,
    outside any graph."""
    name = _register(inner)
    eager = torch.compiler.disable(inner)

    def chunk_gated_delta_rule(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        chunk_size: int = 64,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if initial_state is not None or output_final_state or kwargs.get("cu_seqlens") is not None:
            return eager(
                query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                initial_state=initial_state, output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs,
            )  # fmt: skip
        op = torch.ops.dflash.chunk_gated_delta_rule
        return op(name, query, key, value, g, beta, use_qk_l2norm_in_kernel), None

    chunk_gated_delta_rule.replaced = inner  # type: ignore[attr-defined]
    return chunk_gated_delta_rule


def opaque_causal_conv1d(inner: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `causal_conv1d_fn` ([B, D, T] in and out) through the op; packed
    sequences (`seq_idx`) run `inner` as is, outside any graph."""
    name = _register(inner)
    eager = torch.compiler.disable(inner)

    def causal_conv1d_fn(
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if kwargs.get("seq_idx") is not None:
            return eager(hidden_states, weight, bias, activation=activation, **kwargs)
        op = torch.ops.dflash.causal_conv1d
        return op(name, hidden_states, weight, bias, activation).transpose(1, 2)

    causal_conv1d_fn.replaced = inner  # type: ignore[attr-defined]
    return causal_conv1d_fn


OPAQUE: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "gated_delta_rule": opaque_gated_delta_rule,
    "conv1d": opaque_causal_conv1d,
}
