"""The fused cross-entropy's chunk kernel on its own (issue 28, goal 3): one lm_head chunk's
logits in, per-row CE, argmax correctness and w * (softmax - onehot) out. At Qwen3-8B dims
the drafter step runs 18 chunks of 3,533 x 151,936 bf16 logits, and the profile put the
compiled kernel at 42 ms a step (2.3 ms a chunk), several times what its memory traffic
needs. Times the trainer's kernel (`dflash_loss._ce_and_grad`, compiled as the trainer
compiles it) against the same function compiled with inductor's tuning options, and
against Liger-Kernel's cross-entropy kernel launched on the chunk in place (no host syncs,
float32 CE: `dflash_train/model/liger_ce.py`), each checked against the eager kernel.

One GPU: `python bench/ce_chunk.py --out ce_chunk.json`. A CPU (`--device cpu --rows 64
--vocab 4096`) runs the eager and compiled variants only, to check the script."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from decode_speed import _sync, _timed

from dflash_train.model import liger_ce
from dflash_train.model.dflash_loss import _ce_and_grad, _distill_ce_and_grad

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def log(message: str) -> None:
    print(f"[ce_chunk] {message}", file=sys.stderr, flush=True)


def variants(device: torch.device, distill: bool) -> dict[str, Kernel]:
    eager: Any = _distill_ce_and_grad if distill else _ce_and_grad
    out: dict[str, Kernel] = {
        "eager": eager,
        # As dflash_loss._chunk_kernel compiles it.
        "compiled": torch.compile(eager, dynamic=True, fullgraph=True),
        "compiled_static": torch.compile(eager, dynamic=False, fullgraph=True),
        "compiled_coordinate_descent": torch.compile(
            eager, dynamic=True, fullgraph=True, options={"coordinate_descent_tuning": True}
        ),
    }
    if device.type == "cuda":
        out["compiled_max_autotune"] = torch.compile(
            eager, dynamic=True, fullgraph=True, mode="max-autotune-no-cudagraphs"
        )
        if not distill and liger_ce.available():
            # Unweighted: compare() weights its gradient as the trainer weights the products.
            out["liger_in_place"] = lambda logits, labels, _weights: liger_ce.ce_and_grad_in_place(
                logits, labels
            )
        elif not distill:
            log("liger: liger-kernel or triton is not importable")
    return out


def time_variant(
    name: str, kernel: Kernel, args: tuple[Any, ...], reps: int, device: torch.device
) -> tuple[dict[str, Any], tuple[torch.Tensor, ...]]:
    in_place = name.startswith("liger")
    logits = args[0]
    torch._dynamo.reset()  # each compiled variant from a clean cache, its own kernels

    def call() -> tuple[torch.Tensor, ...]:
        if in_place:
            return kernel(logits.clone(), *args[1:])
        return kernel(*args)

    start = time.perf_counter()
    out = call()  # compile and autotune, outside the timing
    _sync(device)
    compile_s = time.perf_counter() - start
    ms = _timed(call, reps, device)
    if in_place:  # the clone each call makes is not the kernel's
        ms -= _timed(logits.clone, reps, device)
    return {"ms": round(ms, 4), "compile_s": round(compile_s, 2)}, out


def compare(
    reference: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...], weights: torch.Tensor
) -> dict[str, float]:
    ce, correct, grad = got
    grad = grad.float() * weights[:, None]
    return {
        "ce_max_rel": float(((ce - reference[0]).abs() / reference[0].abs().clamp_min(1e-6)).max()),
        "correct_mismatches": int((correct != reference[1]).sum()),
        "grad_max_abs": float((grad - reference[2].float()).abs().max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=3533, help="one chunk at vocab 151,936")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    # Logits of a drafter's scale (std ~3) so softmax is neither flat nor one-hot.
    logits = torch.randn(args.rows, args.vocab, generator=gen, device=device).mul_(3).to(dtype)
    labels = torch.randint(0, args.vocab, (args.rows,), generator=gen, device=device)
    labels[::3] = logits[::3].float().argmax(-1)  # a third of the rows correct
    ones = torch.ones(args.rows, device=device)
    teacher = torch.randn(args.rows, args.vocab, generator=gen, device=device).mul_(3).to(dtype)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": args.rows,
        "vocab": args.vocab,
        "dtype": str(dtype),
        "bytes_read_once": logits.numel() * logits.element_size(),
        "note": "row weights are 1, so every variant's gradient compares with eager's",
        "cases": {},
    }
    for distill in (False, True):
        call_args: tuple[Any, ...] = (logits, labels, ones) + ((teacher, 0.5) if distill else ())
        reference = _distill_ce_and_grad(*call_args) if distill else _ce_and_grad(*call_args)
        for name, kernel in variants(device, distill).items():
            key = f"{'distill_' if distill else ''}{name}"
            try:
                timed, out = time_variant(name, kernel, call_args, args.reps, device)
                timed |= compare(reference, out, ones)
                gb = 2 * result["bytes_read_once"] * (2 if distill else 1) / 1e9
                timed["gb_s_one_read_one_write"] = round(gb / (timed["ms"] / 1e3), 1)
            except Exception as exc:  # a variant that fails says so; the others still run
                timed = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            result["cases"][key] = timed
            log(f"{key}: {json.dumps(timed)}")
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
