"""The report's plots, drawn with matplotlib (Agg, no display): loss on a log scale with its
smoothed line, accuracy, τ (train and held-out), Ktok/s and GPU utilisation, each over the
training steps with the run's checkpoints, (re)starts and alerts as vertical lines. A long
run is drawn from bucket means (at most MAX_POINTS per line), so 200,000 steps take the
same time as 2,000."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import imread, imsave
from matplotlib.ticker import FuncFormatter

from dflash_train.report.series import RunSeries

MAX_POINTS = 2000
MARK_STYLE = {
    "checkpoint": {"color": "#888888", "linestyles": ":", "linewidth": 0.8},
    "restart": {"color": "#1f77b4", "linestyles": "--", "linewidth": 1.2},
    "alert": {"color": "#d62728", "linestyles": "-", "linewidth": 1.0},
}


def smoothed(values: np.ndarray, window: int | None = None) -> np.ndarray:
    """Trailing mean over `window` points (default 1% of the run, at least 5 while the run
    has 25 points), skipping NaNs (a non-finite step) rather than spreading them."""
    window = window or max(1, min(len(values) // 5, max(5, len(values) // 100)))
    finite = np.isfinite(values)
    sums = np.cumsum(np.where(finite, values, 0.0))
    counts = np.cumsum(finite)
    lagged_sums = np.concatenate([np.zeros(window), sums[:-window]])[: len(values)]
    lagged_counts = np.concatenate([np.zeros(window), counts[:-window]])[: len(values)]
    n = counts - lagged_counts
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (sums - lagged_sums) / n, np.nan)


def bucketed(x: np.ndarray, y: np.ndarray, points: int = MAX_POINTS) -> tuple[np.ndarray, ...]:
    """At most `points` (x, y) pairs: the mean of each bucket of consecutive points."""
    if len(x) <= points:
        return x, y
    edges = np.linspace(0, len(x), points + 1).astype(int)
    sizes = np.diff(edges)
    finite = np.isfinite(y)
    ys = np.add.reduceat(np.where(finite, y, 0.0), edges[:-1])
    ns = np.add.reduceat(finite.astype(float), edges[:-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.add.reduceat(x, edges[:-1]) / sizes, np.where(ns > 0, ys / ns, np.nan)


def _marks(ax: Axes, series: RunSeries) -> None:
    groups = {
        "checkpoint": [float(c["step"]) for c in series.checkpoints],
        "restart": [m.step for m in series.restarts],
        "alert": [m.step for m in series.alerts],
    }
    for name, steps in groups.items():
        if steps:  # one artist per kind, however many marks
            ax.vlines(steps, 0, 1, transform=ax.get_xaxis_transform(), label=name, zorder=0,
                      **MARK_STYLE[name])  # fmt: skip


def _line(ax: Axes, series: RunSeries, name: str, label: str, *, smooth: bool = True) -> None:
    values = series.metrics[name]
    x, raw = bucketed(series.steps, values)
    ax.plot(x, raw, color="#9ecae1" if smooth else "#1f77b4", linewidth=0.8, label=label)
    if smooth:
        sx, sy = bucketed(series.steps, smoothed(values))
        ax.plot(sx, sy, color="#08519c", linewidth=1.6, label=f"{label}, smoothed")


def draw_loss(ax: Axes, series: RunSeries) -> None:
    _line(ax, series, "loss", "loss")
    if np.nanmin(series.metrics["loss"], initial=np.inf) > 0:
        ax.set_yscale("log")
        plain = FuncFormatter(lambda value, _pos: f"{value:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    ax.set_ylabel("loss (log)")


def draw_acc(ax: Axes, series: RunSeries) -> None:
    _line(ax, series, "acc", "accuracy")
    ax.set_ylabel("accuracy")


def draw_tau(ax: Axes, series: RunSeries) -> None:
    _line(ax, series, "tau", "τ teacher-forced (train)")
    if series.evals:
        decoded = [e for e in series.evals if e["tau"] is not None]  # a hybrid's: none
        if decoded:
            ax.plot([e["step"] for e in decoded], [e["tau"] for e in decoded], "o-",
                    color="#e6550d", label="τ held-out (speculative decoding)")  # fmt: skip
        tf = [e for e in series.evals if e.get("tau_tf") is not None]
        if tf:
            ax.plot([e["step"] for e in tf], [e["tau_tf"] for e in tf], "s--", color="#fd8d3c",
                    label="τ held-out (teacher-forced)")  # fmt: skip
    ax.set_ylabel("τ (tokens per round)")


def draw_throughput(ax: Axes, series: RunSeries) -> None:
    _line(ax, series, "ktok_s", "Ktok/s")
    ax.set_ylabel("Ktok/s")


def draw_gpus(ax: Axes, series: RunSeries) -> None:
    at = series.step_at(series.gpu_t)
    for index, util in series.gpu_util.items():
        role = series.gpu_roles.get(index, "")
        x, y = bucketed(at, util)
        ax.plot(x, y, linewidth=0.9, label=f"GPU {index} {role}".strip())
    ax.set_ylim(0, 105)
    ax.set_ylabel("GPU utilisation %")


# name -> (title, how to draw it on one axes)
PLOTS: dict[str, tuple[str, Callable[[Axes, RunSeries], None]]] = {
    "loss": ("Loss", draw_loss),
    "acc": ("Accuracy", draw_acc),
    "tau": ("τ, acceptance length", draw_tau),
    "throughput": ("Throughput", draw_throughput),
    "gpus": ("GPU utilisation", draw_gpus),
}


def has_data(name: str, series: RunSeries) -> bool:
    if name == "gpus":
        return bool(series.gpu_util)
    metric = {"throughput": "ktok_s"}.get(name, name)
    return bool(np.isfinite(series.metrics.get(metric, np.zeros(0))).any())


def _finish(ax: Axes, series: RunSeries, title: str) -> None:
    _marks(ax, series)
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best", ncols=2)


def plot_png(name: str, series: RunSeries) -> bytes:
    title, draw = PLOTS[name]
    fig = Figure(figsize=(10, 3.6), dpi=100)
    # Fixed margins: a constrained layout costs more than the drawing itself.
    fig.subplots_adjust(left=0.08, right=0.98, top=0.91, bottom=0.14)
    ax = fig.subplots()
    if has_data(name, series):
        draw(ax, series)
    else:
        ax.text(0.5, 0.5, "nothing in the stream", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip
    _finish(ax, series, title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def stacked_png(images: list[bytes]) -> bytes:
    """The plots' PNGs one above the other in one image (`report --png`), without drawing
    them again."""
    pixels = [imread(io.BytesIO(png), format="png") for png in images]
    width = max(p.shape[1] for p in pixels)
    padded = [
        np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)), constant_values=1.0) for p in pixels
    ]
    buffer = io.BytesIO()
    imsave(buffer, np.concatenate(padded), format="png")
    return buffer.getvalue()
