"""Replay of a long run: how long `dflash-tui replay` takes to read and walk a stream of
STEPS steps (with matching gpu and queue lines), and what moving the time cursor costs
then: a step back (first and following), a jump home, to the middle, one line back from
the middle. Also the snapshots' memory and the process's peak RSS.

    python bench/replay_cursor.py --steps 200000 \
        --out bench/results/console_sources_2core_<date>/replay_cursor_200k.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_tui.sources.replay import Timeline, read_stream_file
from tests.tui.synthetic_stream import write_stream


def timed(call) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--backs", type=int, default=30, help="steps back to time")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_stream(root, args.steps)
        start = time.perf_counter()
        raws = read_stream_file(root / "status.jsonl")
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        timeline = Timeline(raws)
        walk_s = time.perf_counter() - start
    backs = [timed(lambda: timeline.seek(timeline.next_step(-1))) for _ in range(args.backs)]
    result = {
        "steps": args.steps,
        "lines": len(timeline),
        "read_s": round(read_s, 2),
        "index_and_walk_s": round(walk_s, 2),
        "step_back_first_ms": round(backs[0] * 1000),
        "step_back_median_ms": round(statistics.median(backs[1:]) * 1000),
        "step_back_max_later_ms": round(max(backs[1:]) * 1000),
        "home_ms": round(timed(lambda: timeline.seek(0)) * 1000),
        "to_middle_ms": round(timed(lambda: timeline.seek(timeline.end // 2)) * 1000),
        "middle_one_back_ms": round(timed(lambda: timeline.seek(timeline.end // 2 - 1)) * 1000),
        "snapshots": len(timeline._snapshots) + len(timeline._fine),
        "snapshot_mb": round(
            sum(map(len, [*timeline._snapshots.values(), *timeline._fine.values()])) / 1e6, 1
        ),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        # The 2-core machine is shared: times scale with what else runs.
        "load_average_1min": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
