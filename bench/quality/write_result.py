"""Collect one quality run's replies into result.json, the step records into an excerpt, and
draw the loss / teacher-forced tau / held-out tau curve (matplotlib if present, else
plotext's text plot is saved instead).

    python bench/quality/write_result.py --work W --out OUT
    (reads W/prepare.json, W/eval.json, W/curve.json, W/ngram.json, W/run/status.jsonl, and
    W/eval_bf16.json: the same export decoded in the other precision, when it was)
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

DATA_FIELDS = ("prompts", "sources", "passes", "stats", "seconds", "answer_tokens_per_s")
# The names for the eval's speed-up in each precision (`eval --dtype`).
SHORT = {"float32": "fp32", "bfloat16": "bf16"}
# What result.json keeps of a second eval's reply (its per-prompt lists stay in the file).
SECOND_EVAL_FIELDS = (
    "tau", "tokens_per_target_forward", "blocks", "generated_tokens", "baseline_generated_tokens",
    "greedy_seconds", "spec_seconds", "speedup", "lossless", "mismatched_prompts", "divergences",
    "prompts", "dtype", "device",
)  # fmt: skip


def _json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8").strip().splitlines()
        return json.loads(text[-1]) if text else None
    except (OSError, ValueError):
        return None


def records(status: Path, kind: str) -> list[dict[str, Any]]:
    """The stream's lines of `kind`, decoded (the envelope reader skips the others without
    decoding them); none for a stream that cannot be read."""
    from dflash_train.stream.reader import read_envelope

    try:
        lines = status.read_bytes().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        envelope = read_envelope(line)
        if envelope is not None and envelope.kind == kind:
            out.append(json.loads(line))
    return out


def run_evaluations(streams: list[Path]) -> list[dict[str, Any]]:
    """The trainer's own held-out evaluations (`train --eval-every`), as the report reads
    them: step, tau and dtype, one per step (a resumed run's evaluation of a step wins)."""
    from dflash_train.report.series import read_run

    by_step: dict[int, dict[str, Any]] = {}
    for stream in streams:
        if stream.is_file():
            for point in read_run(stream).evals:
                if point.get("tau") is not None:
                    keys = ("step", "tau", "tau_tf_seen", "dtype")
                    by_step[point["step"]] = {k: point.get(k) for k in keys}
    return [by_step[step] for step in sorted(by_step)]


def device_name(streams: list[Path]) -> str | None:
    """The GPU the run trained on, from its first `gpu` record that names one (the plot's
    title said "one H200" after a run on an H100, 2026-12-06)."""
    for stream in streams:
        for record in records(stream, "gpu"):
            names = [g.get("name") for g in record.get("gpus") or () if isinstance(g, dict)]
            if names and names[0]:
                return str(names[0])
    return None


def plot(
    steps: list[dict[str, Any]], curve: list[dict[str, Any]], path: Path, device: str | None
) -> str:
    xs = [r["step"] for r in steps]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no matplotlib"
    fig, left = plt.subplots(figsize=(8, 4.5), dpi=110)
    left.plot(xs, [r["loss"] for r in steps], color="tab:red", label="train loss")
    left.set_xlabel("step")
    left.set_ylabel("loss", color="tab:red")
    right = left.twinx()
    right.plot(
        xs, [r["tau"] for r in steps], color="tab:blue", alpha=0.6,
        label="tau (teacher-forced, training batches)",
    )  # fmt: skip
    if curve:
        right.plot(
            [p["step"] for p in curve], [p["tau"] for p in curve], "o-", color="tab:green",
            label="tau (held-out, real decoding)",
        )  # fmt: skip
    # Teacher-forced on answers it trained on, scored as rounds would accept them: against
    # the held-out points it says whether seen answers fit better (more data would pay).
    seen = [p for p in curve if p.get("tau_tf_seen") is not None]
    if seen:
        right.plot(
            [p["step"] for p in seen], [p["tau_tf_seen"] for p in seen], "s--",
            color="tab:purple", label="tau (teacher-forced, seen answers)",
        )  # fmt: skip
    right.set_ylabel("tau (block 16)")
    lines = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = left.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    left.legend(lines, labels, loc="center right")
    left.set_title("SmolLM2-135M-Instruct drafter" + (f" on one {device}" if device else ""))
    fig.tight_layout()
    fig.savefig(path)
    return "matplotlib"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--commands", type=Path, help="the commands that ran, one a line")
    parser.add_argument(
        "--status", type=Path, action="append",
        help="status streams whose step lines make the curve, in order (default W/run's)",
    )  # fmt: skip
    parser.add_argument(
        "--export-file", type=Path, help="the exported model.safetensors: its bytes and sha256"
    )
    parser.add_argument(
        "--extra", action="append", default=[], metavar="KEY=PATH",
        help="a JSON file to include in result.json under KEY",
    )  # fmt: skip
    args = parser.parse_args()
    work, out = args.work, args.out
    prepare = _json(work / "prepare.json") or {}
    evaluation = _json(work / "eval.json") or {}
    curve = (_json(work / "curve.json") or {}).get("points", [])
    ngram = _json(work / "ngram.json") or {}
    streams = args.status or [work / "run" / "status.jsonl"]
    steps = []
    for stream in streams:  # a resumed run's lines continue the earlier one's
        later = records(stream, "step")
        if steps and later:
            later = [r for r in later if r["step"] > steps[-1]["step"]]
        steps += later
    curve = curve or run_evaluations(streams)  # no curve.py run: the trainer's own
    by_size = {b["block_size"]: b for b in evaluation.get("by_block_size", [])}
    last = steps[-1] if steps else {}
    tail = steps[-10:]
    slot_acc = None
    if tail and tail[0].get("slot_acc"):
        width = len(tail[0]["slot_acc"])
        slot_acc = [round(sum(r["slot_acc"][j] for r in tail) / len(tail), 4) for j in range(width)]
    result = {
        "tau": evaluation.get("tau"),
        "tau_block8": by_size.get(8, {}).get("tau"),
        "lossless": evaluation.get("lossless"),
        "prompts": evaluation.get("prompts"),
        "max_new_tokens": evaluation.get("max_new_tokens"),
        "tokens_per_target_forward": evaluation.get("tokens_per_target_forward"),
        "tokens_per_target_forward_block8": by_size.get(8, {}).get("tokens_per_target_forward"),
        "speedup": evaluation.get("speedup"),
        "speedup_block8": by_size.get(8, {}).get("speedup"),
        "greedy_seconds": evaluation.get("greedy_seconds"),
        "spec_seconds": evaluation.get("spec_seconds"),
        "train_tokens": last.get("tokens"),
        "steps": last.get("step"),
        "final_loss": last.get("loss"),
        "teacher_forced_tau": last.get("tau"),
        "teacher_forced_slot_acc_last10": slot_acc,
        "ngram_slot_acc": ngram.get("ngram_slot_acc"),
        "heldout_tau_curve": curve,
        "trained_on": device_name(streams),
        "data": {k: prepare.get(k) for k in DATA_FIELDS},
        "eval": evaluation,
    }  # fmt: skip
    short = SHORT.get(evaluation.get("dtype", ""))
    if short:
        result[f"speedup_{short}"] = evaluation.get("speedup")
    # The same export in the other precision (the train stage's EVAL_BF16): tau and
    # losslessness stay the first eval's, the speed-up in its precision comes from this one.
    second = _json(work / "eval_bf16.json") or {}
    other = SHORT.get(second.get("dtype", ""))
    if other and other != short:
        result[f"speedup_{other}"] = second.get("speedup")
        result[f"eval_{other}"] = {k: second.get(k) for k in SECOND_EVAL_FIELDS}
    if args.export_file and args.export_file.is_file():
        result["export_bytes"] = args.export_file.stat().st_size
        result["export_sha256"] = hashlib.sha256(args.export_file.read_bytes()).hexdigest()
    for item in args.extra:
        key, _, path = item.partition("=")
        result[key] = _json(Path(path))
    if args.commands and args.commands.is_file():
        result["commands"] = args.commands.read_text(encoding="utf-8").splitlines()
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    excerpt = [r for i, r in enumerate(steps) if i % 2 == 0 or i == len(steps) - 1]
    (out / "status_steps.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in excerpt), encoding="utf-8"
    )
    drawn = plot(steps, curve, out / "curve.png", result["trained_on"])
    print(json.dumps({"plot": drawn, "tau": result["tau"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
