"""Pipeline benchmark for a GPU box: stage rates (target forward only, drafter step only),
the sync and async pipelines end to end, pipeline efficiency, MFU per stage, drafter
starvation, monitor overhead, and the balanced target:drafter split for 8 GPUs.

    python bench/pipeline.py --out bench.json                       # random:qwen3-8b on GPU 0
    python bench/pipeline.py --target random:qwen3.5-27b --target-gpus 0,1 --drafter-gpu 2
    python bench/pipeline.py --device cpu --smoke --out /tmp/b.json  # seconds, on a laptop
    python bench/pipeline.py --target random:qwen3.5-27b --device cpu --smoke  # tiny hybrid

Run it from the repository root with the package installed (or PYTHONPATH=.).

Batches are random token ids held in host memory, so the figures are the GPUs' and the
pipeline's, not the disk's. Each section is time-boxed and an OOM ends only its section."""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dflash_train.data.buckets import Batch
from dflash_train.pipeline.compile_warm_up import linear_attention_kernels
from dflash_train.pipeline.drafter_step import DrafterStepper, StepConfig
from dflash_train.pipeline.monitor import MonitorIntervals, MonitorThread, StepRecord
from dflash_train.pipeline.pool import HiddenStatePool
from dflash_train.pipeline.sources import AsyncSource, EpochPlan, SyncSource
from dflash_train.pipeline.stage_timers import StageTimers
from dflash_train.pipeline.target_workers import HiddenBatch, LoadedBatch, forward_to_drafter
from dflash_train.stream.writer import StatusWriter
from dflash_train.targets.frozen_target import RANDOM_PRESETS, Target, extract_context, load_target

# Dense bf16 peaks by device name (vendor datasheets); unknown GPUs get no MFU.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
SMOKE_TARGETS = {
    "random:qwen3-8b": "random:tiny",
    "random:qwen3-32b": "random:tiny",
    "random:qwen3.5-27b": "random:tiny-hybrid",
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="random:qwen3-8b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--target-gpus", default="0", help="comma-separated GPU indices")
    p.add_argument("--drafter-gpu", type=int, default=None, help="default: first target GPU")
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--target-layers", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-anchors", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--rows", type=int, default=8, help="sequences per batch")
    p.add_argument("--seconds", type=float, default=None, help="per timed section (30; --smoke: 3)")
    p.add_argument("--hs-queue-depth", type=int, default=8)
    p.add_argument("--hs-min-ready", type=int, default=2)
    p.add_argument("--deadline", type=float, default=450.0, help="seconds for all sections")
    p.add_argument(
        "--overhead-rounds", type=int, default=1, help="monitor off/on section pairs (alternating)"
    )
    p.add_argument(
        "--overhead-only", action="store_true", help="only the monitor off/on async sections"
    )
    p.add_argument("--smoke", action="store_true", help="tiny model, short sections (CPU ok)")
    p.add_argument(
        "--suite", choices=("pipeline", "speed"), default="pipeline",
        help="speed: the one-GPU speed suite (bench/speed_suite.py; --device cpu runs it tiny)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=6, help="speed suite: timed drafter steps")
    p.add_argument("--target-calls", type=int, default=8, help="speed suite: timed target calls")
    p.add_argument("--rounds", type=int, default=2, help="speed suite: monitor off/on rounds")
    p.add_argument("--cases", default="", help="speed suite: comma-separated case-name prefixes")
    p.add_argument("--out", type=Path, default=Path("bench_pipeline.json"))
    args = p.parse_args()
    if args.smoke:
        # The same architecture at CPU size: dense stays dense, the hybrid stays hybrid.
        args.target = SMOKE_TARGETS.get(args.target, args.target)
        args.seq_len, args.rows, args.num_anchors = 128, 2, 16
        args.draft_layers, args.target_layers, args.block_size = 1, 2, 4
    if args.seconds is None:  # an explicit --seconds wins (the tests time sections short)
        args.seconds = 3.0 if args.smoke else 30.0
    return args


def build_target(spec: str, device: torch.device) -> Target:
    """Random presets are built here without a tokenizer (the bench never tokenizes)."""
    if not spec.startswith("random:"):
        return load_target(spec, device, _dtype(device))
    from transformers import AutoConfig, AutoModelForCausalLM

    preset = RANDOM_PRESETS[spec.split(":", 1)[1]]
    config = AutoConfig.for_model(preset.model_type, **preset.config)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=_dtype(device))
    model.eval().requires_grad_(False)
    if device.type == "cuda":  # as load_target does: fla's Triton conv1d for a hybrid
        from dflash_train.targets.linear_attention import use_fast_conv1d

        use_fast_conv1d(model)
    embed = model.get_input_embeddings()
    return Target(
        spec, model, None, preset.num_layers, preset.hidden_size,
        int(embed.weight.shape[0]), embed, model.get_output_embeddings(),
    )  # fmt: skip


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class MemoryLoader:
    """Stands in for BatchLoader: random ids, the second half of each row in the loss."""

    def __init__(self, rows: int, seq_len: int, vocab: int, pin: bool, count: int = 8) -> None:
        gen = torch.Generator().manual_seed(0)
        self.batches = []
        for _ in range(count):
            ids = torch.randint(0, vocab, (rows, seq_len), generator=gen)
            mask = torch.zeros_like(ids)
            mask[:, seq_len // 4 :] = 1
            batch = Batch(ids, torch.ones_like(ids), mask, 0)
            self.batches.append(batch.pin_memory() if pin else batch)
        self.tokens = rows * seq_len

    def load(self, plan: EpochPlan, position: int) -> LoadedBatch:
        return LoadedBatch(position, self.batches[position % len(self.batches)], self.tokens)


def sync_all(devices: list[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def run_for(
    seconds: float, step: Callable[[int], int], devices: list[torch.device]
) -> dict[str, float]:
    """Call step(i) (returns tokens) for `seconds` after warm-up calls; Ktok/s. A first call
    that is slow (a compile, a cold allocator) is reported, not counted."""
    start = time.perf_counter()
    step(0)
    sync_all(devices)
    first_s = time.perf_counter() - start
    if first_s > 5:
        log(f"  first call took {first_s:.1f} s")
    step(1)
    sync_all(devices)
    tokens, iters, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += step(iters + 2)
        iters += 1
    sync_all(devices)
    elapsed = time.perf_counter() - start
    return {
        "ktok_s": tokens / elapsed / 1000,
        "iters": iters,
        "seconds": round(elapsed, 2),
        "first_call_s": round(first_s, 2),
    }


class Deadline:
    """The whole bench must end in time on rented GPUs: later sections are skipped."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def guarded(
    name: str, results: dict[str, Any], fn: Callable[[], dict[str, Any]], deadline: Deadline
) -> None:
    if deadline.left() < 0:
        results[name] = {"error": "skipped: out of time (--deadline)"}
        log(f"{name}: skipped, out of time")
        return
    log(f"{name} ...")
    try:
        results[name] = fn()
        log(f"{name}: {json.dumps(results[name])}")
    except torch.cuda.OutOfMemoryError as exc:
        results[name] = {"error": f"OOM: {str(exc).splitlines()[0]}"}
        log(f"{name}: OOM")
    except Exception as exc:  # one broken section must not cost the whole run
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"{name}: failed: {exc}")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def target_flops_per_token(target: Target, last_layer: int, seq_len: int) -> float:
    """2 x the parameters a token passes (embedding excluded) + causal attention scores."""
    layers = target.layers[: last_layer + 1]
    params = sum(p.numel() for layer in layers for p in layer.parameters())
    cfg = target.model.config
    heads = getattr(cfg, "num_attention_heads", 1)
    head_dim = getattr(cfg, "head_dim", None) or target.hidden_size // heads
    attention = 2 * 2 * (seq_len / 2) * heads * head_dim * len(layers)
    return 2 * params + attention


def drafter_flops_per_token(
    drafter: torch.nn.Module, args: argparse.Namespace, vocab: int
) -> float:
    """fwd+bwd (x3) of the drafter per batch token: block queries through every layer and
    the lm_head, plus the fc projection of the context."""
    cfg = drafter.config
    layer_params = sum(p.numel() for p in drafter.layers.parameters())
    queries_per_token = min(args.num_anchors, args.seq_len) * args.block_size / args.seq_len
    block = queries_per_token * (2 * layer_params + 2 * cfg.hidden_size * vocab)
    kv = 2 * 2 * cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim * cfg.num_layers
    context = 2 * len(cfg.target_layer_ids) * cfg.hidden_size**2 + kv
    return 3 * (block + context)


def main() -> int:
    args = parse_args()
    if args.suite == "speed":
        from speed_suite import run_suite

        return run_suite(args)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        log("no CUDA device; use --device cpu")
        return 2
    gpus = [int(g) for g in args.target_gpus.split(",")]
    target_devices = [torch.device(f"cuda:{g}") if cuda else torch.device("cpu") for g in gpus]
    drafter_device = (
        torch.device(f"cuda:{args.drafter_gpu if args.drafter_gpu is not None else gpus[0]}")
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(drafter_device)
        torch.backends.cuda.matmul.allow_tf32 = True
    devices = sorted({*target_devices, drafter_device}, key=str)
    name = torch.cuda.get_device_name(drafter_device) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "device": name}
    log(f"device {name}; loading {args.target} on {[str(d) for d in target_devices]}")
    start = time.perf_counter()
    targets = [build_target(args.target, d) for d in target_devices]
    results["target_load_s"] = round(time.perf_counter() - start, 1)
    results["architecture"] = targets[0].model.config.model_type
    results["linear_attention_kernels"] = linear_attention_kernels(targets[0])

    from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target

    first = targets[0]
    if first.tokenizer is None:  # choose_mask reads len(tokenizer): a random target has none
        first = Target(**{**first.__dict__, "tokenizer": _NoTokenizer(first.vocab_size)})
    config = drafter_config_for_target(
        first, num_layers=args.draft_layers, block_size=args.block_size,
        num_context_layers=args.target_layers,
    )  # fmt: skip
    layer_ids = list(config.target_layer_ids)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).to(drafter_device)
    embed, head = first.embed_tokens, first.lm_head
    if first.device != drafter_device:
        import copy

        embed, head = (
            copy.deepcopy(embed).to(drafter_device),
            copy.deepcopy(head).to(drafter_device),
        )
    timers = StageTimers()
    stepper = DrafterStepper(
        drafter, drafter, embed_tokens=embed, lm_head=head, device=drafter_device, timers=timers,
        config=StepConfig(lr=1e-4, weight_decay=0.01, warmup_steps=10, total_steps=10**6,
                          grad_clip=1.0, block_size=args.block_size,
                          num_anchors=args.num_anchors, seed=0),
    )  # fmt: skip
    loader = MemoryLoader(args.rows, args.seq_len, first.vocab_size, pin=cuda)
    log(f"drafter {sum(p.numel() for p in drafter.parameters()) / 1e6:.1f}M params; "
        f"layers {layer_ids}; batch {args.rows}x{args.seq_len}")  # fmt: skip
    plan = EpochPlan(0, [[0]] * 10**6, list(range(10**6)))

    def target_only() -> dict[str, Any]:
        def step(i: int) -> int:
            batch = loader.batches[i % len(loader.batches)].to(first.device, non_blocking=cuda)
            extract_context(first, batch.input_ids, batch.attention_mask, layer_ids)
            return loader.tokens

        return run_for(args.seconds, step, devices)

    held: list[HiddenBatch] = []

    def drafter_only() -> dict[str, Any]:
        for i in range(2):
            held.append(
                forward_to_drafter(first, loader.load(plan, i), layer_ids, drafter_device, timers)
            )

        def step(i: int) -> int:
            stepper.step(held[i % len(held)], 0)
            return loader.tokens

        return run_for(args.seconds, step, devices)

    def pipeline(source: Any, monitor: MonitorThread | None = None) -> dict[str, Any]:
        batches = source.batches(plan, lambda: False)
        step_no = [0]

        def step(_i: int) -> int:
            hb = next(batches)
            hb.wait_ready(drafter_device)
            stepper.step(hb, 0)
            step_no[0] += 1
            if monitor is not None:
                monitor.submit_step(StepRecord(step_no[0], 0, 0.0, stepper.lr, 0, hb.tokens,
                                               time.monotonic(), stepper.snapshot()))  # fmt: skip
            return hb.tokens

        try:
            out = run_for(args.seconds, step, devices)
        finally:
            batches.close()
        if source.pool is not None:
            stats = source.pool.stats()
            out["starved"] = round(stats.starved_takes / max(1, stats.takes), 4)
        return out

    def sync_pipeline() -> dict[str, Any]:
        return pipeline(SyncSource(loader, first, layer_ids=layer_ids,
                                   drafter_device=drafter_device, timers=timers))  # type: ignore[arg-type]  # fmt: skip

    def async_pipeline(with_monitor: bool) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            pool: HiddenStatePool[HiddenBatch] = HiddenStatePool(
                args.hs_queue_depth, args.hs_min_ready
            )
            source = AsyncSource(
                loader,  # type: ignore[arg-type]
                targets,
                layer_ids=layer_ids,
                drafter_device=drafter_device,
                timers=timers,
                pool=pool,
            )
            monitor = None
            if with_monitor:
                status = Path(tempfile.mkdtemp()) / "status.jsonl"
                monitor = MonitorThread(
                    StatusWriter(status, "bench"), block_size=args.block_size, max_bad_steps=10**9,
                    on_fatal=lambda _m: None, timers=timers, pool=pool, producers=len(targets),
                    gpu_roles={d.index: "target" for d in target_devices if d.index is not None},
                    allocator_devices=tuple(d for d in devices if d.type == "cuda"),
                    intervals=MonitorIntervals(profile=5.0),
                )  # fmt: skip
                monitor.start()
            try:
                return pipeline(source, monitor)
            finally:
                source.close()
                if monitor is not None:
                    monitor.stop()

        return run

    deadline = Deadline(args.deadline)
    if not args.overhead_only:
        guarded("target_forward_only", results, target_only, deadline)
        guarded("drafter_step_only", results, drafter_only, deadline)
        held.clear()
        guarded("sync_pipeline", results, sync_pipeline, deadline)
    guarded("async_pipeline", results, async_pipeline(with_monitor=False), deadline)
    guarded("async_pipeline_monitored", results, async_pipeline(with_monitor=True), deadline)
    # Monitor off/on again, alternating: a single pair of short sections cannot tell a small
    # overhead from drift (clocks, temperature) between them.
    for round_no in range(2, args.overhead_rounds + 1):
        for monitored in (False, True):
            name = f"async_pipeline{'_monitored' if monitored else ''}_{round_no}"
            guarded(name, results, async_pipeline(with_monitor=monitored), deadline)
    summarise(results, targets, drafter, args, peak, len(target_devices))
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {args.out}")
    print(json.dumps(results["summary"], indent=2))
    return 0


class _NoTokenizer:
    mask_token_id = None

    def __init__(self, size: int) -> None:
        self._size = size

    def __len__(self) -> int:
        return self._size


def _rate(results: dict[str, Any], key: str) -> float | None:
    value = results.get(key, {}).get("ktok_s")
    return float(value) if value else None


def summarise(
    results: dict[str, Any], targets: list[Target], drafter: Any, args: argparse.Namespace,
    peak: float | None, n_targets: int,
) -> None:  # fmt: skip
    target_rate = _rate(results, "target_forward_only")
    drafter_rate = _rate(results, "drafter_step_only")
    sync_rate = _rate(results, "sync_pipeline")
    async_rate = _rate(results, "async_pipeline")
    monitored = _rate(results, "async_pipeline_monitored")
    layer_ids = list(drafter.config.target_layer_ids)
    t_flops = target_flops_per_token(targets[0], max(layer_ids), args.seq_len)
    d_flops = drafter_flops_per_token(drafter, args, targets[0].vocab_size)
    summary: dict[str, Any] = {
        "target_ktok_s": target_rate,
        "drafter_ktok_s": drafter_rate,
        "sync_ktok_s": sync_rate,
        "async_ktok_s": async_rate,
        "async_monitored_ktok_s": monitored,
        "target_gflop_per_token": round(t_flops / 1e9, 3),
        "drafter_gflop_per_token": round(d_flops / 1e9, 3),
    }
    if target_rate and drafter_rate:
        slower = min(target_rate * n_targets, drafter_rate)
        summary["pipeline_efficiency"] = round(async_rate / slower, 3) if async_rate else None
        split = max(range(1, 8), key=lambda nt: min(nt * target_rate, (8 - nt) * drafter_rate))
        summary["balanced_split_8_gpus"] = {
            "target_gpus": split,
            "drafter_gpus": 8 - split,
            "expected_ktok_s": round(min(split * target_rate, (8 - split) * drafter_rate), 2),
        }
    if peak:
        summary["target_mfu"] = (
            round(target_rate * 1e3 * t_flops / peak, 4) if target_rate else None
        )
        summary["drafter_mfu"] = (
            round(drafter_rate * 1e3 * d_flops / peak, 4) if drafter_rate else None
        )
    summary["drafter_starved"] = results.get("async_pipeline", {}).get("starved")
    if async_rate and monitored:
        summary["monitor_overhead"] = round(1 - monitored / async_rate, 4)
    rounds = [
        (
            _rate(results, f"async_pipeline{suffix}"),
            _rate(results, f"async_pipeline_monitored{suffix}"),
        )
        for suffix in ["", *(f"_{n}" for n in range(2, args.overhead_rounds + 1))]
    ]
    pairs = [(off, on) for off, on in rounds if off and on]
    if len(pairs) > 1:
        summary["monitor_overhead_rounds"] = [round(1 - on / off, 4) for off, on in pairs]
        summary["monitor_overhead_mean"] = round(
            1 - sum(on for _, on in pairs) / sum(off for off, _ in pairs), 4
        )
    results["summary"] = {k: (round(v, 3) if isinstance(v, float) and math.isfinite(v) else v)
                          for k, v in summary.items()}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
