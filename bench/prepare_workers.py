"""`prepare` at box scale on one GPU: answer tokens/s of one worker against two workers sharing
the GPU (the multi-device path; two GPUs would each hold one), and the host-RAM peak of two
target replicas loading at once from a safetensors directory, the old way (`from_pretrained`
into host memory, then `.to(device)`) against the new (`load_target`: straight onto the
device from the memory-mapped file).

    python3 bench/prepare_workers.py --out $OUT/prepare_workers.json            # H200, ~5 min
    python3 bench/prepare_workers.py --smoke --out /tmp/pw.json                 # CPU, ~2 min

GPU: `random:qwen3-8b` (Qwen3-8B's shape, random weights: the rate does not depend on them)
for the tokens/s part; the same model saved once to local disk for the load part. A random
target needs only SmolLM2's tokenizer: DFLASH_CACHE_DIR must hold
`models/smollm2-135m-instruct/` with config.json and the tokenizer files (see the header of
bench/scripts/prepare_workers_session.sh for what to carry). Each phase writes its part of
the result as soon as it is measured."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.05


def _dflash(*args: str, timeout: float) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "dflash_train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"ok": False, "error": result.stderr[-3000:], "rc": result.returncode}


def throughput(devices: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One prepare run, cut by --max-seconds: answer tokens/s overall and per worker."""
    out = work / f"data_{devices.replace(',', '_').replace(':', '')}"
    argv = ["prepare", "--target-model", args.target, "--prompts", "builtin*100"]
    argv += ["--samples", str(args.samples), "--max-new-tokens", str(args.new_tokens)]
    argv += ["--chunk-size", str(args.chunk), "--devices", devices, "--out", str(out)]
    argv += ["--max-seconds", str(args.seconds), "--overwrite"]
    if args.batch_size:
        argv += ["--batch-size", str(args.batch_size)]
    began = time.monotonic()
    reply = _dflash(*argv, timeout=args.seconds + 240)
    wall = time.monotonic() - began
    if not reply.get("ok"):
        return {"devices": devices, "error": reply.get("error"), "wall_s": round(wall, 1)}
    return {
        "devices": devices,
        "wall_s": round(wall, 1),
        "seconds": reply["seconds"],
        "answer_tokens": reply["stats"]["answer_tokens"],
        "samples": reply["stats"]["samples"],
        "unanswered": reply["unanswered"],
        "answer_tokens_per_s": reply["answer_tokens_per_s"],
        "workers": reply["workers"],
    }


def _memory(pid: int) -> dict[str, int]:
    """kB of resident memory: anonymous (private copies) and file-backed (mapped pages)."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                fields[name] = int(value.split()[0])
    except OSError:
        pass
    return fields


def load_replicas(way: str, model: Path, devices: list[str]) -> dict[str, Any]:
    """Replicas loading at once, one process each; the peak of their summed RSS."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "load-one", way, str(model), device],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for device in devices
    ]
    peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    while any(p.poll() is None for p in procs):
        readings = [_memory(p.pid) for p in procs if p.poll() is None]
        for name in peak:
            peak[name] = max(peak[name], sum(r.get(name, 0) for r in readings))
        time.sleep(POLL_S)
    loads = [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in procs]  # type: ignore[union-attr]
    return {
        "way": way,
        "replicas": len(devices),
        "peak_rss_gib": round(peak["VmRSS"] / 2**20, 2),
        "peak_anon_gib": round(peak["RssAnon"] / 2**20, 2),
        "peak_file_gib": round(peak["RssFile"] / 2**20, 2),
        "load_s": [entry["load_s"] for entry in loads],
        "own_peak_rss_gib": [entry["peak_rss_gib"] for entry in loads],
    }


def load_one(way: str, model: str, device: str) -> None:
    """Child: load one replica `way` and say how long it took (and its own VmHWM)."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT))
    from dflash_train.targets.frozen_target import load_target

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    began = time.monotonic()  # imports done: the load alone
    if way == "old":
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    else:
        loaded = load_target(model, device, dtype).model
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.monotonic() - began
    hwm = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM")
    )
    assert loaded is not None
    print(json.dumps({"load_s": round(seconds, 2), "peak_rss_gib": round(hwm / 2**20, 2)}))


def save_model(target: str, path: Path) -> float:
    """The random target saved as a safetensors model directory (what a real target is)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from dflash_train.targets.frozen_target import load_target

    began = time.monotonic()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    loaded = load_target(target, device, dtype)
    loaded.model.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    del loaded
    return round(time.monotonic() - began, 1)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "load-one":
        load_one(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU, random:tiny, seconds")
    parser.add_argument("--work", type=Path, default=Path("/tmp/prepare_workers"))
    parser.add_argument("--seconds", type=float, default=100.0, help="each throughput run")
    parser.add_argument("--phases", default="throughput,load")
    args = parser.parse_args()
    gpu = not args.smoke
    args.target = "random:qwen3-8b" if gpu else "random:tiny"
    args.samples, args.chunk = (16384, 1024) if gpu else (16, 4)
    args.new_tokens = 256 if gpu else 8
    args.batch_size = None if gpu else 4
    if args.smoke:
        args.seconds = min(args.seconds, 60.0)
    args.work.mkdir(parents=True, exist_ok=True)
    devices = ("cuda:0", "cuda:0,cuda:0") if gpu else ("cpu", "cpu,cpu")
    result: dict[str, Any] = {"target": args.target, "smoke": args.smoke, "runs": []}

    def write() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    if "throughput" in args.phases:
        for spec in devices:
            result["runs"].append(throughput(spec, args, args.work))
            write()
            print(json.dumps(result["runs"][-1]), flush=True)
        one, two = (run.get("answer_tokens_per_s") for run in result["runs"][:2])
        if one and two:
            result["two_workers_over_one"] = round(two / one, 3)
    if "load" in args.phases:
        model = args.work / "model"
        if not (model / "config.json").is_file():
            result["save_s"] = save_model(args.target, model)
        pair = ["cuda:0", "cuda:0"] if gpu else ["cpu", "cpu"]
        result["load"] = [load_replicas(way, model, pair) for way in ("old", "new")]
        write()
        print(json.dumps(result["load"]), flush=True)
    write()


if __name__ == "__main__":
    main()
