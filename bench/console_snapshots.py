"""Bench helper (not a test): the real console, built from a `dflash-tui` command line as the
program builds it, run headless on a machine without tmux, saving what it shows as SVG every
--every seconds until the run's stream ends (or --seconds pass), then once more. For a GPU
machine the console can only be watched from through files:

    python bench/console_snapshots.py --out DIR --every 60 --seconds 600 -- \
        --run-dir /tmp/run --python python3 --watch

The SVGs open in a browser (or headless Chromium makes PNGs of them)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path


async def watch(
    argv: list[str], out: Path, every: float, seconds: float, size: tuple[int, int]
) -> int:
    from dflash_tui.cli import build_console
    from dflash_tui.cli_args import build_parser, exec_prefix

    args = build_parser().parse_args(argv)
    app = build_console(args, exec_prefix(args))
    out.mkdir(parents=True, exist_ok=True)
    shots = 0
    began = time.monotonic()
    async with app.run_test(size=size) as pilot:
        next_shot = began
        while True:
            now = time.monotonic()
            ended = app.state.end is not None
            if now >= next_shot or ended or now - began > seconds:
                await pilot.pause()
                app.save_screenshot(f"screen_{shots:03d}_{int(now - began):04d}s.svg", str(out))
                shots += 1
                next_shot = now + every
            if ended or now - began > seconds:
                break
            await asyncio.sleep(1.0)
        if ended:  # the header and panes are redrawn on the app's tick: one after the end
            await asyncio.sleep(3.0)
            await pilot.pause()
            app.save_screenshot(f"screen_{shots:03d}_end.svg", str(out))
            shots += 1
    print(f"{shots} screenshots in {out}; run ended: {ended}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--size", default="160x48", help="COLUMNSxROWS")
    parser.add_argument("console_args", nargs="*", help="after --: dflash-tui's arguments")
    args = parser.parse_args()
    columns, rows = (int(v) for v in args.size.split("x"))
    return asyncio.run(
        watch(args.console_args, args.out, args.every, args.seconds, (columns, rows))
    )


if __name__ == "__main__":
    sys.exit(main())
