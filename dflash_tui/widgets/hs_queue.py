"""The hidden-state queue pane: ready batches against the depth with the min-ready mark,
producer and consumer waits, how often the drafter starved, and the bucket mix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static

from dflash_tui.widgets import units


def queue_gauge(ready: int, depth: int, min_ready: int, width: int) -> str:
    """`█████··│···` : filled up to ready, `│` at min-ready (where the drafter may draw)."""
    depth = max(depth, 1)
    cells = [("█" if (i + 0.5) * depth / width < ready else "·") for i in range(width)]
    mark = min(width - 1, max(0, round(min_ready * width / depth) - 1))
    cells[mark] = "┃"
    return "".join(cells)


def render_queue(
    queue: Mapping[str, Any] | None, colours: Mapping[str, str], width: int
) -> RenderableType:
    if queue is None:
        return Text("waiting for the first queue reading…", style="dim")
    ready, depth = int(queue["hs_ready"]), int(queue["hs_queue_depth"])
    min_ready = int(queue["hs_min_ready"])
    starved = float(queue["starved"])
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("ready ")
    colour = colours["success"] if ready >= min_ready else colours["warning"]
    out.append(f"{ready}/{depth}", style=f"bold {colour}")
    out.append(f"  min-ready {min_ready}\n")
    gauge_width = max(8, min(40, width - 4))
    out.append(queue_gauge(ready, depth, min_ready, gauge_width) + "\n", style=colour)
    out.append(f"producer wait {units.percent(queue['producer_wait'])}   ")
    out.append(f"consumer wait {units.percent(queue['consumer_wait'])}\n")
    out.append("drafter starved ")
    starved_colour = colours[
        "error" if starved > 0.2 else "warning" if starved > 0.05 else "success"
    ]
    out.append(f"{100 * starved:.1f}%\n", style=f"bold {starved_colour}")
    out.append("bucket mix ", style="dim")
    out.append(bucket_mix_text(queue["bucket_mix"]))
    return out


def bucket_mix_text(mix: Mapping[str, Any]) -> str:
    numbers = {str(k): float(v) for k, v in mix.items() if isinstance(v, (int, float))}
    total = sum(numbers.values())
    if not numbers or total <= 0:
        return "–"
    return " · ".join(f"{k} {100 * v / total:.0f}%" for k, v in numbers.items())


class HsQueuePane(Static):
    BORDER_TITLE = "2 HS queue"
