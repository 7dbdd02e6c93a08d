"""Where one drafter step's time goes (issue 28, goal 3): speed_drafter's rig at Qwen3-8B or
Qwen3.6-27B dims, warmed up so compiling and autotuning stay outside, then a few steps under
torch.profiler. Writes the chrome trace and a summary: device kernel time per category
(matmul, attention, loss, norm, elementwise, optimizer, communication, memcpy_memset, other),
the top kernels (each with its call sites: the ops around its launch and the launching op's
input shapes, which say whose a copy or pointwise kernel is), the idle gap (step wall time
not covered by any kernel: the launch-bound part) and the useful-FLOP share of the step by
speed_drafter's count.

One GPU: `python bench/profile_drafter.py --dims qwen3-8b --out DIR`. On a CPU
(`--device cpu --smoke`) CPU ops' self time stands in for kernel time, same keys."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from speed_drafter import PEAK, DrafterRig, _sync, drafter_config, log, time_drafter

from dflash_train.model.attention_layout import flex_compile_mode, set_flex_autotune
from dflash_train.model.dflash_loss import CE_KERNELS, set_ce_kernel
from dflash_train.model.drafter_compile import PROFILER_RANGE

# speed_suite's shapes: (batch, seq, anchors, block, layers).
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "qwen3-8b": (8, 2048, 512, 16, 5),
    "qwen3.6-27b": (4, 2048, 512, 16, 5),
    "tiny": (2, 128, 16, 4, 1),
}
CATEGORIES = (
    "matmul", "attention", "loss", "norm", "elementwise", "optimizer", "communication",
    "memcpy_memset", "other",
)  # fmt: skip
GZIP_ABOVE = 4 << 20  # the device hands back files of at most 16 MiB
HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
DEVICE_CATS = {"kernel", "cuda_kernel", "gpu_memcpy", "gpu_memset"}
BACKWARD_NODE = "autograd::engine::evaluate_function:"
SITES = 3  # call sites kept per top kernel

# Matched against a kernel's name, or on the CPU an op's name. cuBLAS on Hopper names most
# GEMMs nvjet_* (no "gemm" in them); fmha_cutlass* is attention, so attention is tried first.
ATTENTION_WORDS = ("flash", "fmha", "attention", "flex", "sdpa")
GEMM_WORDS = ("gemm", "nvjet", "cutlass", "wgmma", "xmma", "cublas", "gemv", "splitkreduce")
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot"}
# Matched against the launching ops and ranges, forward context included.
LOSS_WORDS = ("_linearcrossentropy", "cross_entropy", "logsumexp", "log_softmax", "nll_loss")
# The drafter's compiled pointwise stretches (inside PROFILER_RANGE): their fused kernels
# count as norm where they hold an RMSNorm's reduction, else as elementwise.
NORM_KERNEL_WORDS = ("rsqrt", "mean")
# Outside the loss and those stretches (tried first), the compiled graphs are flex's.
COMPILED_WORDS = ("compiledfunction", "torch-compiled region", "compiledfxgraph")
OPTIMIZER_WORDS = ("optimizer.step", "adam", "multi_tensor_apply", "_foreach", "clip_grad")
NORM_WORDS = ("rms_norm", "rmsnorm", "layer_norm")
ELEMENTWISE_WORDS = ("elementwise", "triton_poi", "catarraybatchedcopy")
ELEMENTWISE_OPS = {
    "mul", "add", "sub", "div", "neg", "exp", "pow", "rsqrt", "silu", "silu_backward", "cos",
    "sin", "copy", "_to_copy", "to", "clone", "contiguous", "fill", "zero", "zeros", "cat",
    "where", "masked_fill", "type_as", "eq", "ne", "lt", "gt", "abs", "clamp", "clamp_min",
    "isfinite", "constant_pad_nd", "index_copy", "maximum",
}  # fmt: skip


@dataclass(frozen=True)
class ProfileRequest:
    dims: str
    device: torch.device
    batch: int
    seq: int
    anchors: int
    block: int
    layers: int
    attention: str
    warmup: int
    steps: int
    out: Path
    compile_layers: bool = True
    flex_autotune: bool = False
    ce_kernel: str = "auto"  # the trainer's default
    tag: str = ""  # names the outputs: profile_<dims>[_<tag>].json, trace_<dims>[_<tag>].json


@dataclass(frozen=True)
class Item:
    """One kernel (or, on the CPU, one op's self time) with what launched it."""

    name: str
    us: float
    start: float
    end: float
    context: str  # the enclosing ops and ranges, then the forward op's for backward work
    launcher: str  # the innermost op that launched it
    device_cat: str
    dims: str = ""  # the launching op's input shapes (record_shapes), e.g. "[[4096, 512], []]"


def _bare(op: str) -> str:
    return op.lower().removeprefix("aten::").rstrip("_")


def categorise(item: Item) -> str:
    name, context, launcher = item.name.lower(), item.context, _bare(item.launcher)
    if item.device_cat in ("gpu_memcpy", "gpu_memset") or "memcpy" in name or "memset" in name:
        return "memcpy_memset"
    if "nccl" in name or "c10d::" in context:
        return "communication"
    if any(w in name or w in context for w in ATTENTION_WORDS):
        return "attention"
    if any(w in name for w in GEMM_WORDS) or launcher in MATMUL_OPS:
        return "matmul"
    if any(w in name or w in context for w in LOSS_WORDS):
        return "loss"
    if PROFILER_RANGE in context:
        return "norm" if any(w in name for w in NORM_KERNEL_WORDS) else "elementwise"
    if any(w in context for w in COMPILED_WORDS):
        return "attention"
    if any(w in name or w in context for w in OPTIMIZER_WORDS):
        return "optimizer"
    if any(w in name or w in context for w in NORM_WORDS):
        return "norm"
    if any(w in name for w in ELEMENTWISE_WORDS) or launcher in ELEMENTWISE_OPS:
        return "elementwise"
    return "other"


@dataclass
class _Frame:
    name: str
    start: float
    dur: float
    path: tuple[str, ...]
    forward: tuple[str, ...]  # for work inside a backward node: its forward op's path
    backward: bool
    op: bool
    dims: str = ""
    child_us: float = 0.0


def read_trace(events: list[dict[str, Any]]) -> tuple[list[Item], list[Item], list[float]]:
    """(device kernels, CPU ops' self times, ProfilerStep wall µs) from a chrome trace. Host
    threads are walked in time order with a stack of open ranges, so each launch knows the
    ops around it; a backward node's sequence number leads back to the forward op that made
    it, whose ops (rms_norm, the loss, a compiled region) categorise the backward work too."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS]
    host.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    stacks: dict[tuple[Any, Any], list[_Frame]] = defaultdict(list)
    forward: dict[int, tuple[str, ...]] = {}
    launches: dict[int, tuple[str, str, str]] = {}
    ops: list[Item] = []
    steps: list[float] = []

    def close(frame: _Frame) -> None:
        if frame.op:
            ops.append(Item(frame.name, frame.dur - frame.child_us, frame.start,
                            frame.start + frame.dur, _context(frame.path, frame.forward),
                            frame.name, "cpu_op", frame.dims))  # fmt: skip

    for e in host:
        ts, dur, cat, args = e["ts"], e.get("dur", 0.0), e["cat"], e.get("args", {})
        stack = stacks[(e.get("pid"), e.get("tid"))]
        while stack and stack[-1].start + stack[-1].dur <= ts:
            close(stack.pop())
        parent = stack[-1] if stack else None
        if parent is not None:
            parent.child_us += dur
        if cat in ("cuda_runtime", "cuda_driver"):
            if "correlation" in args and parent is not None:
                op = next((f for f in reversed(stack) if f.op), parent)
                context = _context(parent.path, parent.forward)
                launches[args["correlation"]] = (context, op.name, op.dims)
            continue
        name = e["name"]
        if cat == "user_annotation" and name.startswith("ProfilerStep#"):
            steps.append(dur)
        path = (parent.path if parent else ()) + (name,)
        fwd, backward = (parent.forward, parent.backward) if parent else ((), False)
        seq = args.get("Sequence number")
        if name.startswith(BACKWARD_NODE):
            fwd, backward = forward.get(seq, ()) if seq is not None else (), True
        elif seq is not None and not backward:
            forward[seq] = path  # the last (innermost) op with this number made the node
        dims = json.dumps(args["Input Dims"]) if "Input Dims" in args else ""
        stack.append(_Frame(name, ts, dur, path, fwd, backward, cat == "cpu_op", dims))
    for stack in stacks.values():
        while stack:
            close(stack.pop())
    kernels = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS:
            continue
        launched = launches.get(e.get("args", {}).get("correlation", -1), ("", "", ""))
        context, launcher, dims = launched
        kernels.append(Item(e["name"], e.get("dur", 0.0), e["ts"], e["ts"] + e.get("dur", 0.0),
                            context, launcher, e["cat"], dims))  # fmt: skip
    return kernels, ops, steps


def _context(path: tuple[str, ...], fwd: tuple[str, ...]) -> str:
    return (" / ".join(path) + (" <- " + " / ".join(fwd) if fwd else "")).lower()


def site(item: Item, depth: int = 4) -> str:
    """Where a kernel came from, short enough to read in a table: the last `depth` ops and
    ranges around its launch, and for backward work the last `depth` of its forward op's
    (the step's ProfilerStep#N left out, so one call site is one site at every step)."""

    def tail(path: str) -> str:
        parts = [p for p in path.split(" / ") if p and not p.startswith("profilerstep#")]
        return " / ".join(parts[-depth:])

    here, _, forward = item.context.partition(" <- ")
    return tail(here) + (" <- " + tail(forward) if forward else "")


@dataclass
class _Spent:
    us: float = 0.0
    calls: int = 0

    def add(self, us: float) -> None:
        self.us += us
        self.calls += 1


@dataclass
class _KernelTotals:
    """One kernel name's time, and how it splits by launching op and by call site."""

    spent: _Spent = field(default_factory=_Spent)
    launchers: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    sites: defaultdict[tuple[str, str], _Spent] = field(default_factory=lambda: defaultdict(_Spent))


def union_us(items: list[Item]) -> float:
    total, reach = 0.0, float("-inf")
    for item in sorted(items, key=lambda i: i.start):
        if item.end > reach:
            total += item.end - max(item.start, reach)
            reach = item.end
    return total


def summarise(
    items: list[Item],
    step_walls_us: list[float],
    step_ms: float,
    flops: float,
    top: int = 25,
    categorise: Callable[[Item], str] = categorise,
    categories: Sequence[str] = CATEGORIES,
) -> dict[str, Any]:
    """Per-step figures from one trace's items; shares are of the profiled step's wall.
    `categorise` and `categories`: the drafter step's by default (profile_target.py has the
    target stage's)."""
    n = max(1, len(step_walls_us))
    wall_ms = sum(step_walls_us) / n / 1e3
    per_cat: dict[str, float] = dict.fromkeys(categories, 0.0)
    # One name may launch in several places: its time per launcher, and per call site and
    # launching shapes (what says which copy or pointwise kernel is whose).
    by_name: dict[tuple[str, str], _KernelTotals] = defaultdict(_KernelTotals)
    by_launcher: dict[str, float] = defaultdict(float)
    for item in items:
        cat = categorise(item)
        per_cat[cat] += item.us
        totals = by_name[(item.name, cat)]
        totals.spent.add(item.us)
        totals.launchers[item.launcher or "?"] += item.us
        totals.sites[(site(item), item.dims)].add(item.us)
        by_launcher[item.launcher or "?"] += item.us
    kernel_ms = sum(per_cat.values()) / n / 1e3
    busy_ms = union_us(items) / n / 1e3
    idle_ms = max(0.0, wall_ms - busy_ms)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1].spent.us)[:top]
    matmul_attention_s = (per_cat["matmul"] + per_cat["attention"]) / n / 1e6
    return {
        "profiled_step_ms": round(wall_ms, 3),
        "kernel_ms_per_step": round(kernel_ms, 3),
        "busy_ms_per_step": round(busy_ms, 3),
        "idle_ms_per_step": round(idle_ms, 3),
        "idle_share": round(idle_ms / wall_ms, 4) if wall_ms else None,
        "categories": {
            c: {"ms": round(us / n / 1e3, 3), "share": round(us / n / 1e3 / wall_ms, 4)}
            for c, us in per_cat.items()
        },
        "top_kernels": [
            {
                "name": name[:300],
                "category": cat,
                "ms_per_step": round(t.spent.us / n / 1e3, 3),
                "calls_per_step": round(t.spent.calls / n, 2),
                "share": round(t.spent.us / n / 1e3 / wall_ms, 4),
                "launched_by": max(t.launchers, key=t.launchers.__getitem__),
                "sites": [
                    {
                        "at": at,
                        "dims": dims,
                        "ms_per_step": round(spent.us / n / 1e3, 3),
                        "calls_per_step": round(spent.calls / n, 2),
                    }
                    for (at, dims), spent in sorted(t.sites.items(), key=lambda kv: -kv[1].us)[
                        :SITES
                    ]
                ],
            }
            for (name, cat), t in ranked
        ],
        "top_launching_ops": [
            {"op": op, "ms_per_step": round(us / n / 1e3, 3)}
            for op, us in sorted(by_launcher.items(), key=lambda kv: -kv[1])[:15]
        ],
        "useful_flops_per_step": flops,
        "peak_flops": PEAK,
        "useful_share_of_step": round(flops / PEAK / (step_ms / 1e3), 4),
        "useful_share_of_profiled_step": round(flops / PEAK / (wall_ms / 1e3), 4),
        # The rate the matmul and attention kernels reach on the FLOPs that count: near the
        # measured ~790 TFLOP/s ceiling means the lost time is outside them.
        "useful_tflops_in_matmul_attention_kernels": (
            round(flops / matmul_attention_s / 1e12, 1) if matmul_attention_s else None
        ),
    }


def record(step: Callable[[], Any], device: torch.device, steps: int, trace: Path) -> None:
    """`steps` calls of `step` under the profiler after one profiler-warm-up call (the first
    profiled one pays for starting the tracer), synchronised before the first and after the
    last so each recorded step's kernels fall inside the recorded window."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(
        activities=activities,
        record_shapes=True,
        with_stack=False,
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as prof:
        for i in range(steps + 1):
            step()
            if i in (0, steps):
                _sync(device)
            prof.step()


def pack_trace(trace: Path) -> Path:
    """The trace, gzipped where it is too big to come back from the device as it is."""
    if trace.stat().st_size <= GZIP_ABOVE:
        return trace
    packed = trace.with_suffix(".json.gz")
    with gzip.open(packed, "wb", compresslevel=6) as f:
        f.write(trace.read_bytes())
    trace.unlink()
    return packed


def _name(req: ProfileRequest) -> str:
    return f"{req.dims}_{req.tag}" if req.tag else req.dims


def profile_drafter(req: ProfileRequest) -> dict[str, Any]:
    set_flex_autotune(req.flex_autotune)
    set_ce_kernel(req.ce_kernel)
    if req.device.type == "cuda":
        torch.cuda.set_device(req.device)
        torch.backends.cuda.matmul.allow_tf32 = True  # as speed_suite runs it
    config = drafter_config(req.dims, req.layers, req.block)
    rig = DrafterRig(
        config, req.batch, req.seq, req.anchors, req.device, compile_layers=req.compile_layers
    )
    log(f"{req.dims} {req.batch}x{req.seq}: warm-up (compile, {req.warmup} timed steps)")
    timing = time_drafter(rig, req.attention, req.warmup)
    req.out.mkdir(parents=True, exist_ok=True)
    trace = req.out / f"trace_{_name(req)}.json"
    log(f"profiling {req.steps} steps")
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    record(rig.step, rig.device, req.steps, trace)
    graphs = counters["stats"]["unique_graphs"] - graphs
    events = json.loads(trace.read_text())["traceEvents"]
    kernels, ops, step_walls = read_trace(events)
    on_device = req.device.type == "cuda"
    flops = rig.useful_flops()
    summary = summarise(kernels if on_device else ops, step_walls, timing["ms_per_step"], flops)
    trace = pack_trace(trace)
    return {
        "dims": req.dims,
        "device": torch.cuda.get_device_name(req.device) if on_device else "cpu",
        "torch": torch.__version__,
        "shape": {
            "batch": req.batch,
            "seq": req.seq,
            "anchors": req.anchors,
            "block": req.block,
            "layers": req.layers,
            "attention": req.attention,
            "drafter_layers": timing["drafter_layers"],
            "flex_mode": flex_compile_mode() if req.attention == "flex" else None,
            "ce_kernel": req.ce_kernel,
        },
        "steps_profiled": len(step_walls),
        "measure": "CUDA kernels" if on_device else "CPU op self time (no device)",
        "step_ms": timing["ms_per_step"],
        **summary,
        "profiler_overhead": round(summary["profiled_step_ms"] / timing["ms_per_step"] - 1, 4),
        # Kernels run about as long under the profiler; the host, slower, may open gaps that
        # the unprofiled step does not have: this is the gap against the unprofiled step.
        "idle_ms_per_step_unprofiled": round(
            max(0.0, timing["ms_per_step"] - summary["busy_ms_per_step"]), 3
        ),
        "graphs_compiled_while_profiled": graphs,
        # Time some host thread spends inside an op: near the step on a GPU, the host is what
        # the device waits for.
        "host_op_ms_per_step": round(union_us(ops) / max(1, len(step_walls)) / 1e3, 3),
        "flop_count": "speed_drafter.DrafterRig.useful_flops (speed_suite.py docstring)",
        "timing": timing,
        "trace": trace.name,
        "trace_bytes": trace.stat().st_size,
    }


def print_table(result: dict[str, Any]) -> None:
    shape = result["shape"]
    print(f"{result['dims']} {shape['batch']}x{shape['seq']} {shape['attention']}, "
          f"layers {shape['drafter_layers']}, flex mode {shape['flex_mode']}: "
          f"step {result['step_ms']} ms (profiled {result['profiled_step_ms']} ms), "
          f"{result['measure']}")  # fmt: skip
    print_categories(result)
    print(
        f"  useful-FLOP share of the step {result['useful_share_of_step']:.1%}; "
        f"matmul+attention kernels at "
        f"{result['useful_tflops_in_matmul_attention_kernels']} useful TFLOP/s"
    )
    print_top(result)


def print_categories(result: dict[str, Any], width: int = 15) -> None:
    print(f"  {'category':<{width}}{'ms/step':>10}{'share':>8}")
    for name, cat in result["categories"].items():
        print(f"  {name:<{width}}{cat['ms']:>10.2f}{cat['share']:>8.1%}")
    print(f"  {'idle (launch)':<{width}}{result['idle_ms_per_step']:>10.2f}"
          f"{result['idle_share'] or 0:>8.1%}")  # fmt: skip


def print_top(result: dict[str, Any], width: int = 12) -> None:
    for k in result["top_kernels"][:10]:
        print(f"  {k['ms_per_step']:>9.2f} ms {k['calls_per_step']:>7.1f}x "
              f"{k['category']:<{width}} {k['name'][:70]}")  # fmt: skip
        for at in k.get("sites", [])[:SITES]:
            print(
                f"  {'':>9}    {at['ms_per_step']:>7.2f} ms at {at['at'][:100]} {at['dims'][:60]}"
            )


def write_result(
    path: Path, result: dict[str, Any], table: Callable[[dict[str, Any]], None]
) -> int:
    """The summary beside its trace, and its table on stdout."""
    path.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {path} and {result['trace']}")
    table(result)
    return 0


def parse_args(argv: list[str] | None = None) -> ProfileRequest:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny dims, one warm-up step")
    p.add_argument("--batch", type=int, help="rows (default: the dims' speed-suite shape)")
    p.add_argument("--seq", type=int)
    p.add_argument("--anchors", type=int)
    p.add_argument("--block", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--attention", choices=("flex", "sdpa"), help="default: flex on cuda")
    p.add_argument("--warmup", type=int, default=3, help="timed steps before profiling")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--out", type=Path, default=Path("profile_drafter"))
    p.add_argument(
        "--drafter-layers", choices=("compiled", "eager"), default="compiled",
        help="compiled: the trainer's default on CUDA (drafter_compile.py); the CPU runs eager",
    )  # fmt: skip
    p.add_argument(
        "--flex-autotune", action="store_true",
        help="compile flex with inductor's max-autotune-no-cudagraphs (times its tile configs)",
    )  # fmt: skip
    p.add_argument(
        "--ce-kernel", choices=CE_KERNELS, default="auto",
        help="the fused cross-entropy's chunk kernel, as the trainer's --ce-kernel (auto: "
        "Liger-Kernel's where installed, else inductor's)",
    )  # fmt: skip
    p.add_argument("--tag", default="", help="suffix of the output names, e.g. eager")
    a = p.parse_args(argv)
    dims = "tiny" if a.smoke else a.dims
    attention = a.attention or ("flex" if a.device == "cuda" else "sdpa")
    if a.device == "cpu" and attention == "flex":
        p.error("--attention flex: flex attention has no CPU backward; use sdpa on a CPU")
    batch, seq, anchors, block, layers = SHAPES[dims]
    return ProfileRequest(
        dims=dims, device=torch.device("cuda:0" if a.device == "cuda" else "cpu"),
        batch=a.batch or batch, seq=a.seq or seq, anchors=a.anchors or anchors,
        block=a.block or block, layers=a.layers or layers, attention=attention,
        warmup=1 if a.smoke else a.warmup, steps=a.steps, out=a.out,
        compile_layers=a.drafter_layers == "compiled", flex_autotune=a.flex_autotune,
        ce_kernel=a.ce_kernel, tag=a.tag,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    req = parse_args(argv)
    result = profile_drafter(req)
    return write_result(req.out / f"profile_{_name(req)}.json", result, print_table)


if __name__ == "__main__":
    sys.exit(main())
