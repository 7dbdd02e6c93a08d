"""One drafter's long schedule over several runs, each started from the one before's export
(`train --init-from`): the held-out tau of every hop against the steps since the first
hop began, in one PNG, with each hop's 40 x 256 figure at its end.

    python bench/quality/lineage.py run5=bench/results/quality_smollm2/run5 \
        run6=bench/results/quality_smollm2 --out DIR

Each hop is a quality result dir (its result.json, as write_result.py writes it): the in-run
evaluations (`heldout_tau_curve`: 10 prompts x 128, bf16) and the hop's own `steps` and
`tau`. Hops are named in order; a hop's steps are counted after the hops before it.
Writes lineage.json and lineage.png, and fit.json: the hops' 40 x 256 tau against the log of
the drafter's total steps at each hop's end, a least-squares line (the runs of 2026-12-07 sat
within 0.004 of one), with the steps it puts at --goal. A planning figure, not a law: the
line may bend, so each new hop is the check: --recent K fits the last K hops alone too
(fit.json's `recent`, drawn dash-dotted), which shows a bend the whole line averages away.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any


def hops(named: list[str]) -> list[dict[str, Any]]:
    """Each NAME=DIR's curve and figures, its steps offset by the hops before it."""
    out: list[dict[str, Any]] = []
    offset = 0
    for item in named:
        name, sep, where = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"lineage: {item!r}: expected NAME=RESULT_DIR")
        path = Path(where) / "result.json"
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"lineage: {path}: unreadable ({exc})") from None
        steps = result.get("steps")
        if not isinstance(steps, int):
            raise SystemExit(f"lineage: {path}: no `steps`")
        curve = [
            {"step": offset + p["step"], "hop_step": p["step"], "tau": p["tau"]}
            for p in result.get("heldout_tau_curve") or ()
            if isinstance(p.get("step"), int) and p.get("tau") is not None
        ]
        out.append({
            "name": name, "dir": where, "start": offset, "end": offset + steps,
            "tau_40x256": result.get("tau"), "lossless": result.get("lossless"),
            "init_from": (result.get("init_from") or {}).get("run"), "curve": curve,
        })  # fmt: skip
        offset += steps
    return out


def log_fit(lineage: list[dict[str, Any]], goal: float | None) -> dict[str, Any] | None:
    """tau_40x256 = intercept + slope * ln(total steps), over the hops that have both; None
    below two such hops at distinct steps. `steps_for_goal` is where the line reaches goal
    (None when it never rises to it), `more_steps` how far that is past the last hop's end."""
    points = [(h["name"], h["end"], h["tau_40x256"]) for h in lineage]
    points = [(n, s, t) for n, s, t in points if t is not None and s > 0]
    logs = [math.log(s) for _, s, _ in points]
    if len(set(logs)) < 2:  # a line needs two distinct ends (a 0-step hop shares one)
        return None
    slope, intercept = statistics.linear_regression(logs, [t for _, _, t in points])
    residuals = {
        n: round(t - (intercept + slope * x), 4) for (n, _, t), x in zip(points, logs, strict=True)
    }
    fit: dict[str, Any] = {
        "form": "tau_40x256 = intercept + slope * ln(total steps)",
        "slope": round(slope, 4),
        "intercept": round(intercept, 4),
        "per_doubling": round(slope * math.log(2), 4),
        "max_abs_residual": max(abs(r) for r in residuals.values()),
        "residuals": residuals,
        "goal": goal,
        "steps_for_goal": None,
        "more_steps": None,
    }
    if goal is not None and slope > 0:
        steps = math.exp((goal - intercept) / slope)
        fit["steps_for_goal"] = round(steps)
        fit["more_steps"] = max(0, round(steps - lineage[-1]["end"]))
    return fit


def _draw_fit(
    ax: Any, fit: dict[str, Any], first: float, end: float, style: str, color: str, name: str
) -> float:
    """A log_fit line from `first`, drawn on to where it meets the goal if that is within
    twice the steps so far (further out, the hops would be squeezed to the left); returns
    where it stops."""
    last = max(end, min(fit["steps_for_goal"] or 0, 2 * end))
    xs = [first + (last - first) * i / 100 for i in range(101)]
    ax.plot(
        xs, [fit["intercept"] + fit["slope"] * math.log(x) for x in xs], style, color=color,
        label=f"{name}: {fit['intercept']:.3f} + {fit['slope']:.3f} ln(steps)",
    )  # fmt: skip
    return last


def plot(lineage: list[dict[str, Any]], fit: dict[str, Any] | None, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(10.5, 4.5), dpi=110)
    for hop in lineage:
        line = ax.plot(
            [p["step"] for p in hop["curve"]], [p["tau"] for p in hop["curve"]], "o-",
            label=f"{hop['name']}: held-out, 10 x 128, bf16",
        )  # fmt: skip
        if hop["tau_40x256"] is not None:
            ax.plot(
                [hop["end"]], [hop["tau_40x256"]], "*", markersize=14, color=line[0].get_color(),
                label=f"{hop['name']}: {hop['tau_40x256']:.3f} on 40 x 256, fp32",
            )  # fmt: skip
        if hop["start"]:
            ax.axvline(hop["start"], color="grey", linestyle=":", linewidth=1)
    if fit is not None:
        first = min(h["end"] for h in lineage if h["end"] > 0)
        last = _draw_fit(ax, fit, first, lineage[-1]["end"], "--", "grey", "fit")
        if fit["steps_for_goal"] and fit["steps_for_goal"] <= last:
            ax.axhline(fit["goal"], color="black", linestyle=":", linewidth=1)
        recent = fit.get("recent")
        if recent is not None:
            names = recent["hops"]
            start = next(h["end"] for h in lineage if h["name"] == names[0])
            label = f"fit of {names[0]}-{names[-1]}"
            _draw_fit(ax, recent, start, lineage[-1]["end"], "-.", "black", label)
    ax.set_xlabel("steps since the first hop began")
    ax.set_ylabel("held-out τ (tokens per draft-verify round)")
    ax.set_title("One drafter over several runs (train --init-from)")
    ax.grid(alpha=0.3)
    # beside the axes: inside them, two entries a hop covered the newest hop's curve
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hop", nargs="+", help="NAME=RESULT_DIR, first hop first")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--goal", type=float, help="the 40 x 256 tau to place on the fit")
    parser.add_argument("--recent", type=int, help="also fit the last K hops alone (K >= 2)")
    args = parser.parse_args()
    if args.recent is not None and args.recent < 2:
        parser.error(f"--recent: a line needs two hops, got {args.recent}")
    lineage = hops(args.hop)
    fit = log_fit(lineage, args.goal)
    if fit is not None and args.recent is not None:
        recent = log_fit(lineage[-args.recent :], args.goal)
        if recent is not None:
            fit["recent"] = {"hops": [h["name"] for h in lineage[-args.recent :]], **recent}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lineage.json").write_text(json.dumps(lineage, indent=1) + "\n", encoding="utf-8")
    (args.out / "fit.json").write_text(json.dumps(fit, indent=1) + "\n", encoding="utf-8")
    drawn = plot(lineage, fit, args.out / "lineage.png")
    print(json.dumps({"hops": [h["name"] for h in lineage], "png": drawn, "fit": fit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
