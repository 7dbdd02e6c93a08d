"""A quality study's variants side by side: each run's held-out evaluations (the `eval` events
its trainer wrote, `train --eval-every`) and its recorded recipe, read from its status stream,
into study.json, a markdown table (study.md) and one PNG of held-out tau against step.

    python bench/quality/study.py base=RUN_DIR layers3=RUN_DIR ... --out DIR
    python bench/quality/study.py STUDY_DIR --out DIR    # one run dir per variant in it

The first variant named (or `base`, in a study dir) is the baseline the others are compared
with. A run still training, stopped by a signal or never started is listed as it stands.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dflash_train import protocol
from dflash_train.report.series import RunSeries, read_run
from dflash_train.rundir import RunDir, read_json

# Options that say where a run ran, how it was watched or what it keeps: not its recipe, so
# never "what differs from the baseline".
NOT_RECIPE = frozenset({
    "output_dir", "run_id", "resume_from", "target_gpus", "drafter_gpus", "hs_queue_depth",
    "hs_min_ready", "profile_interval", "stall_after", "keep_checkpoints", "log_every",
    "save_every", "max_bad_steps", "data_dir",
})  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@dataclass
class Variant:
    name: str
    run_dir: Path
    config: dict[str, Any] = field(default_factory=dict)
    layer_ids: list[int] | None = None
    dataset: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    steps_done: int = 0
    steps_per_s: float | None = None
    state: str = "no stream"
    starts: int = 0

    @property
    def max_steps(self) -> int | None:
        return self.config.get("max_steps")

    def final(self) -> dict[str, Any] | None:
        return self.curve[-1] if self.curve else None

    def best(self) -> dict[str, Any] | None:
        return max(self.curve, key=lambda p: p["score"]) if self.curve else None


def eval_points(series: RunSeries) -> list[dict[str, Any]]:
    """Every held-out evaluation of the run, one per step (the newest wins: a run resumed at
    an evaluated step, or an evaluation by hand, scores that step again), ordered by step,
    each with its score by protocol.eval_score (a hybrid target's is teacher-forced)."""
    by_step: dict[int, dict[str, Any]] = {}
    for point in series.evals:
        score = protocol.eval_score(point)
        if score is not None:
            by_step[point["step"]] = point | {"score": score}
    return [by_step[s] for s in sorted(by_step)]


def _steps_per_s(series: RunSeries) -> float | None:
    """The median rate between consecutive step lines: evaluations, checkpoints and the gap
    between two calls' trainers are a few pairs of many, so they do not move it."""
    if len(series.steps) < 2:
        return None
    d_step, d_t = np.diff(series.steps), np.diff(series.step_t)
    rates = d_step[(d_step > 0) & (d_t > 0)] / d_t[(d_step > 0) & (d_t > 0)]
    return round(float(np.median(rates)), 4) if len(rates) else None


def _recorded_config(run_dir: Path) -> dict[str, Any]:
    """A launched run's config.json (sections of options), flattened as run_start has it."""
    record = read_json(RunDir.at(run_dir).config)
    sections = record.get("config") if isinstance(record, dict) else None
    if not isinstance(sections, dict):
        return {}
    return {k: v for part in sections.values() if isinstance(part, dict) for k, v in part.items()}


def read_variant(name: str, run_dir: Path) -> Variant:
    variant = Variant(name, run_dir)
    stream = RunDir.at(run_dir).status
    if not stream.is_file():
        variant.config = _recorded_config(run_dir)
        return variant
    series = read_run(stream)
    start = series.start
    # The newest start's recipe: a variant that failed and was started again with another
    # budget (a session's call for it alone) trained on that one, not the first's.
    variant.config = dict(series.newest_start.get("config") or {}) or _recorded_config(run_dir)
    variant.layer_ids = start.get("layer_ids")
    variant.dataset = dict(start.get("dataset") or {})
    variant.curve = eval_points(series)
    # The last step line can be up to --log-every steps short of where a trainer stopped.
    ends = [series.end.get("step")] if series.end else []
    done = [*series.steps.tolist(), *ends, *(c["step"] for c in series.checkpoints)]
    variant.steps_done = int(max((s for s in done if isinstance(s, (int, float))), default=0))
    variant.steps_per_s = _steps_per_s(series)
    variant.starts = len(series.restarts) + (1 if start else 0)
    if series.end is not None:
        variant.state = str(series.end.get("reason"))
    else:
        variant.state = "running" if start else "not started"
    return variant


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def differs(variant: Variant, base: Variant) -> list[str]:
    """What of the variant's recipe is not the baseline's, as short `option value` words."""
    out = []
    for key, mine in variant.config.items():
        if key in NOT_RECIPE or key.startswith("wandb_") or mine == base.config.get(key):
            continue
        word = f"{key} {_show(mine)}"
        if key == "target_layers" and variant.layer_ids:
            word += f" (layers {_show(variant.layer_ids)})"
        out.append(word)
    mine, theirs = variant.dataset.get("samples"), base.dataset.get("samples")
    if mine is not None and (
        mine != theirs or variant.config.get("data_dir") != base.config.get("data_dir")
    ):
        ratio = f" (x{mine / theirs:.1f})" if theirs else ""
        out.append(f"data {mine:,} samples{ratio}")
    return out


def _tau(point: dict[str, Any] | None) -> str:
    if point is None:
        return "–"
    kind = "" if point["tau"] is not None else " tf"  # a hybrid target's: teacher-forced
    lossless = "" if point["lossless"] is not False else ", NOT lossless"
    if lossless and isinstance(point.get("mismatched"), int):
        lossless += f" ({point['mismatched']}/{point['prompts']})"
    return f"{point['score']:.3f}{kind} @{point['step']:,}{lossless}"


def _number(value: Any, spec: str = ",") -> str:
    return "–" if value is None else format(value, spec)


def round_shares(point: dict[str, Any] | None) -> dict[int, float] | None:
    """Of an evaluation's rounds, the share that kept at least 1, 2, 4 and 8 drafts: where a
    variant's tau comes from (the first draft right more often, or longer runs)."""
    lengths = (point or {}).get("round_lengths")
    return protocol.round_shares(lengths) if lengths else None


def _shares(point: dict[str, Any] | None) -> str:
    shares = round_shares(point)
    if shares is None:
        return "–"
    return " / ".join(f"{100 * share:.0f}" for share in shares.values())


def _fit(point: dict[str, Any] | None) -> str:
    """Teacher-forced τ on training samples it trained on / on the held-out answers: a
    variant that fits what it saw no better than what it did not is short of capacity or
    signal, not of data."""
    if point is None:
        return "–"
    return " / ".join(
        "–" if point.get(k) is None else f"{point[k]:.3f}" for k in ("tau_tf_seen", "tau_tf")
    )


def table(variants: list[Variant], base: Variant) -> str:
    rows = [
        f"| variant | differs from `{base.name}` | held-out τ, final | best "
        "| rounds keeping ≥ 1 / 2 / 4 / 8 drafts, % | τ teacher-forced, seen / held-out "
        "| steps | samples | steps/s | state |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in variants:
        what = "; ".join(differs(v, base)) or "the same recipe"
        if v is base or not v.config:
            what = "(baseline)" if v is base else "no recorded config"
        rows.append(
            f"| {v.name} | {what} | {_tau(v.final())} | {_tau(v.best())} | {_shares(v.final())} "
            f"| {_fit(v.final())} | {v.steps_done:,} / {_number(v.max_steps)} "
            f"| {_number(v.dataset.get('samples'))} | {_number(v.steps_per_s, '.3g')} "
            f"| {v.state} |"
        )
    return "\n".join(rows) + "\n"


def measured_on(variants: list[Variant]) -> str:
    """How the held-out tau was measured (the first evaluation's), for the table's heading."""
    first = next((v.curve[0] for v in variants if v.curve), None)
    if first is None:
        return "no held-out evaluation yet"
    eval_data = next((v.config.get("eval_data") for v in variants if v.curve), None)
    return (
        f"held-out τ: {first['prompts']} prompts x up to {first['tokens']} new tokens of "
        f"{eval_data or 'DATA_DIR/heldout.jsonl'}, {first['dtype'] or '?'}"
    )


def plot(variants: list[Variant], base: Variant, path: Path, title: str) -> None:
    # The Figure API without pyplot, as `dflash-train report --png` draws (report/plots.py).
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 5.5), dpi=100)
    fig.subplots_adjust(left=0.08, right=0.76, top=0.88, bottom=0.1)
    ax = fig.subplots()
    for k, v in enumerate(variants):
        final = v.final()
        label = f"{v.name}: {final['score']:.3f}" if final else f"{v.name}: no eval yet"
        # Markers and dashes as well as colours: seven lines of near τ cross and overlap.
        style = MARKERS[k % len(MARKERS)] + ("-" if k < len(MARKERS) else "--")
        ax.plot([p["step"] for p in v.curve], [p["score"] for p in v.curve], style,
                linewidth=2.6 if v is base else 1.3, markersize=4, label=label)  # fmt: skip
    ax.set_title(f"{title}\n{measured_on(variants)}", loc="left", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out τ (tokens per draft-verify round)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="final τ")
    fig.savefig(path, format="png")


def summary(variants: list[Variant], base: Variant) -> dict[str, Any]:
    def one(v: Variant) -> dict[str, Any]:
        final, best = v.final(), v.best()
        return {
            "name": v.name,
            "run_dir": str(v.run_dir),
            "differs": [] if v is base else differs(v, base),
            "config": v.config,
            "layer_ids": v.layer_ids,
            "dataset": v.dataset,
            "curve": v.curve,
            "final_tau": final and final["score"],
            "final_step": final and final["step"],
            # Of the final evaluation's rounds, the share that kept at least d drafts.
            "final_round_shares": round_shares(final),
            # Teacher-forced on training samples it saw, and on the held-out answers.
            "final_tau_tf_seen": final and final.get("tau_tf_seen"),
            "final_tau_tf": final and final.get("tau_tf"),
            "best_tau": best and best["score"],
            "best_step": best and best["step"],
            "steps_done": v.steps_done,
            "max_steps": v.max_steps,
            "steps_per_s": v.steps_per_s,
            "state": v.state,
            "starts": v.starts,
        }

    scored = [v for v in variants if v.final()]
    leader = max(scored, key=lambda v: v.final()["score"]).name if scored else None
    return {
        "baseline": base.name,
        "measured": measured_on(variants),
        "highest_final_tau": leader,
        "variants": [one(v) for v in variants],
    }


def variant_dirs(specs: list[str]) -> list[tuple[str, Path]]:
    """NAME=RUN_DIR pairs in the order given; a bare dir is one run (named by its folder) or,
    without a stream of its own, a study dir holding one run dir per variant."""
    out: list[tuple[str, Path]] = []
    for spec in specs:
        name, sep, where = spec.partition("=")
        if sep:
            out.append((name, Path(where)))
            continue
        root = Path(spec)
        if RunDir.at(root).status.is_file():
            out.append((root.name, root))
            continue
        runs = sorted(p for p in root.iterdir() if RunDir.at(p).status.is_file())
        # `base` first: the study stage's baseline, whatever the names sort as
        runs.sort(key=lambda p: p.name != "base")
        out.extend((p.name, p) for p in runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=RUN_DIR, a run dir, or a study dir")
    parser.add_argument("--out", required=True, type=Path, help="study.json/.md/.png go here")
    parser.add_argument("--baseline", help="the variant the others are compared with")
    parser.add_argument("--title", default="Held-out τ against step")
    args = parser.parse_args()
    pairs = variant_dirs(args.runs)
    if not pairs:
        parser.error("no run dirs found")
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        parser.error(f"variant names repeat: {names}")
    if args.baseline is not None and args.baseline not in names:
        parser.error(f"--baseline {args.baseline}: not one of {names}")
    variants = [read_variant(name, path) for name, path in pairs]
    base = variants[names.index(args.baseline or names[0])]
    args.out.mkdir(parents=True, exist_ok=True)
    data = summary(variants, base)
    text = json.dumps(data, indent=1, allow_nan=False, default=_finite)
    (args.out / "study.json").write_text(text + "\n", encoding="utf-8")
    markdown = f"{measured_on(variants)}; baseline `{base.name}`\n\n{table(variants, base)}"
    (args.out / "study.md").write_text(markdown, encoding="utf-8")
    plot(variants, base, args.out / "study.png", args.title)
    sys.stdout.write(markdown)
    return 0


def _finite(value: Any) -> Any:
    """numpy numbers the stream's readers hand back, as JSON numbers (NaN as null)."""
    number = float(value)
    return number if math.isfinite(number) else None


if __name__ == "__main__":
    sys.exit(main())
