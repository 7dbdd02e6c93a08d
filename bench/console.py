"""Console performance: attach to a run whose stream holds 200,000 steps (plus matching gpu
and queue lines) and time the first complete frame; then feed 100 status lines/s for a
minute and report the console's CPU share and RSS.

    python bench/console.py                       # LocalTransport on this machine
    python bench/console.py --ssh root@127.0.0.1:22 --known-hosts ~/.ssh/known_hosts

Over SSH the run directory is created on this machine and read through the SSH server, so
use a loopback server (the trainer's commands must be on its PATH, or pass --python).

The stream is written as the trainer writes it: through StatusWriter with the history
summary kept beside it (`--no-keeper`: without, as streams of older trainers), steps from 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_train.stream.summary_cache import KEPT_POINTS
from dflash_train.stream.writer import StatusWriter
from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.sources.transport import LocalTransport, SshTransport, Transport
from tests.tui.synthetic_stream import RUN_ID, lines

# A separate process appends lines at a steady rate, as the trainer's monitor thread would
# (through StatusWriter, keeping the summary), so its CPU is not the console's.
FEEDER = r"""
import sys, time
from dflash_train.stream.writer import StatusWriter
from tests.tui.synthetic_stream import RUN_ID, gpu_fields, queue_fields, step_fields
path, step = sys.argv[1], int(sys.argv[2])
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
points = int(sys.argv[5]) if sys.argv[5] != "none" else None
writer = StatusWriter(__import__("pathlib").Path(path), RUN_ID, summary_points=points)
start = time.monotonic()
n = 0
while (elapsed := time.monotonic() - start) < seconds:
    while n < elapsed * rate:
        if n % 10 == 0:
            writer.write("queue", **queue_fields(n))
        elif n % 10 == 5:
            writer.write("gpu", **gpu_fields(n))
        else:
            writer.write("step", **{**step_fields(step, 40000, 6), "step": step})
            step += 1
        n += 1
    time.sleep(0.01)
writer.close()
print(n)
"""


def write_run(run_dir: Path, steps: int, *, keeper: bool) -> int:
    """The synthetic run of `steps` steps (numbered from 1, as the trainer does), written
    through the trainer's StatusWriter; returns the last step."""
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = StatusWriter(
        run_dir / "status.jsonl", RUN_ID, summary_points=KEPT_POINTS if keeper else None
    )
    for text in lines(steps):
        record = json.loads(text)
        kind, t = record.pop("kind"), record.pop("t")
        for envelope in ("v", "seq", "run"):
            record.pop(envelope)
        if kind in ("step", "checkpoint"):
            record["step"] += 1
        writer.write(kind, t=t, **record)
    writer.close()
    return steps


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    """CPU of our live child processes (the `tail --follow` command), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def make_transport(args: argparse.Namespace) -> Transport:
    if args.ssh is None:
        return LocalTransport()
    user, _, hostport = args.ssh.rpartition("@")
    host, _, port = hostport.partition(":")
    return SshTransport(
        host,
        port=int(port) if port else None,
        username=user or None,
        exec_prefix=("pct", "exec", args.container, "--") if args.container else (),
        known_hosts=args.known_hosts or os.path.expanduser("~/.ssh/known_hosts"),
        **({"client_keys": [args.identity]} if args.identity else {}),
    )


async def first_frame(app: DflashApp, pilot: Any, last_step: int) -> dict[str, float]:
    """Seconds from attach to the first complete frame: the history is in and every pane
    has drawn it; split into the box summarising its stream (`tail --history`) and the
    console drawing it."""
    started = time.perf_counter()
    first_line = history_in = None
    while not (
        app.state.step == last_step
        and app.frame_is_current()
        and f"step {last_step:,}" in str(app.screen.query_one("RunHeader").render())
    ):
        await pilot.pause(0.01)
        if first_line is None and app.state.lines_applied:
            first_line = time.perf_counter() - started
        if history_in is None and app.state.step == last_step:
            history_in = time.perf_counter() - started
    return {
        "first_frame_s": time.perf_counter() - started,
        "first_line_s": first_line or 0.0,
        "history_in_s": history_in or 0.0,
        "history_lines": float(app.state.lines_applied),
    }


async def bench(args: argparse.Namespace) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    run_dir = root / "run"
    t = time.perf_counter()
    last_step = write_run(run_dir, args.steps, keeper=args.keeper)
    count = sum(1 for _ in (run_dir / "status.jsonl").open("rb"))
    size = (run_dir / "status.jsonl").stat().st_size
    print(
        f"stream: {args.steps:,} steps, {count:,} lines, {size / 1e6:.0f} MB, written in "
        f"{time.perf_counter() - t:.1f} s ({'with' if args.keeper else 'without'} the summary)"
    )

    options = ConsoleOptions(
        target_name="bench",
        run_dir=str(run_dir),
        python=args.python,
        follow_gpus=False,
    )
    results: dict[str, float] = {}
    # The first attach summarises the whole stream on the box and saves the summary beside
    # it; later attaches continue that summary (what an operator sees every time after).
    for attach in range(args.attaches):
        suffix = "" if attach == 0 else f"_attach{attach + 1}"
        app = DflashApp(make_transport(args), options)
        async with app.run_test(size=(160, 48)) as pilot:
            timing = await first_frame(app, pilot, last_step)
        results.update({f"{key}{suffix}": value for key, value in timing.items()})
        print(f"attach {attach + 1}: first complete frame {timing['first_frame_s']:.2f} s")

    app = DflashApp(make_transport(args), options)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(app, pilot, last_step)

        points = str(KEPT_POINTS) if args.keeper else "none"
        feeder = subprocess.Popen(
            [sys.executable, "-c", FEEDER, str(run_dir / "status.jsonl"),
             str(last_step + 1), str(args.rate), str(args.seconds), points],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        rss = [rss_mb()]
        cpu0, child0, wall0 = own_cpu_s(), children_cpu_s(), time.perf_counter()
        cpu_last, wall_last = cpu0, wall0
        cpu_windows: list[float] = []
        while feeder.poll() is None:
            await pilot.pause(args.sample_every)
            rss.append(rss_mb())
            now_cpu, now = own_cpu_s(), time.perf_counter()
            cpu_windows.append(100 * (now_cpu - cpu_last) / (now - wall_last))
            cpu_last, wall_last = now_cpu, now
            first_x = app.state.history.first_x("loss")
            print(
                f"  t={now - wall0:5.1f}s rss={rss[-1]:.0f} MB cpu={cpu_windows[-1]:.1f}% "
                f"step={app.state.step} loss plot from step {first_x:.0f}"
            )
        wall = time.perf_counter() - wall0
        fed = int((feeder.stdout.read() if feeder.stdout else "0").strip() or 0)
        results["fed_lines"] = float(fed)
        results["console_cpu_pct"] = 100 * (own_cpu_s() - cpu0) / wall
        results["tail_cpu_pct"] = 100 * (children_cpu_s() - child0) / wall
        results["rss_start_mb"] = rss[0]
        results["rss_max_mb"] = max(rss)
        results["rss_end_mb"] = rss[-1]
        half = len(cpu_windows) // 2
        if half:
            results["cpu_first_half_pct"] = sum(cpu_windows[:half]) / half
            results["cpu_second_half_pct"] = sum(cpu_windows[half:]) / (len(cpu_windows) - half)
            results["rss_first_half_max_mb"] = max(rss[: half + 1])
            results["rss_second_half_max_mb"] = max(rss[half + 1 :])
        results["history_kb"] = app.state.history.nbytes() / 1024
        results["loss_plot_first_step"] = float(app.state.history.first_x("loss") or -1)
    shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=100.0, help="status lines per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--attaches", type=int, default=2, help="attaches timed before the feed")
    parser.add_argument("--ssh", metavar="[user@]host[:port]", default=None)
    parser.add_argument("--known-hosts", default=None)
    parser.add_argument("--identity", default=None, help="SSH private key file")
    parser.add_argument("--container", default=None, help="run commands in `pct exec ID --`")
    parser.add_argument(
        "--no-keeper",
        dest="keeper",
        action="store_false",
        help="write the stream without the history summary beside it",
    )
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--python", default=sys.executable, help="Python of dflash_train")
    args = parser.parse_args()
    results = asyncio.run(bench(args))
    for key, value in results.items():
        print(f"{key:>24}: {value:,.2f}")
    if args.out:
        record = {
            "argv": sys.argv[1:],
            "results": results,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
