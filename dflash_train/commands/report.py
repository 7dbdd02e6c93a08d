"""`dflash-train report RUN_DIR --out report.html [--png]`: the run as one self-contained
HTML file (config, topology, dataset, plots of loss, accuracy, τ, Ktok/s and GPU
utilisation with checkpoints, restarts and alerts marked, the checkpoint table), made from
the status stream alone; `--png` also writes every plot as one image beside it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory, or a status stream file in one"
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="the HTML file to write")
    parser.add_argument(
        "--png", action="store_true", help="also write every plot in one PNG (FILE's name, .png)"
    )


def _fail(message: str) -> int:
    print(f"dflash-train report: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    given = Path(args.run_dir)
    stream = given if given.suffix == ".jsonl" else given / "status.jsonl"
    if not stream.is_file():
        return _fail(f"run_dir: {stream} is not a status stream")
    out = Path(args.out)
    if not out.parent.is_dir():
        return _fail(f"out: {out.parent} is not a directory")
    from dflash_train.report import page, plots
    from dflash_train.report.series import read_run

    series = read_run(stream)
    if not series.start and not len(series.steps):
        return _fail(f"run_dir: {stream} holds no run_start and no step")
    images = {
        name: (title, plots.plot_png(name, series)) for name, (title, _) in plots.PLOTS.items()
    }
    written = [out]
    out.write_text(page.render(series, images), encoding="utf-8")
    if args.png:
        png = out.with_suffix(".png")
        png.write_bytes(plots.stacked_png([image for _, image in images.values()]))
        written.append(png)
    seconds = time.monotonic() - start
    names = " and ".join(str(p) for p in written)
    print(f"report: {names} ({len(series.steps):,} steps, {seconds:.1f} s)", file=sys.stderr)
    return 0
