"""The GPU pane: one row per GPU with its role, utilization bar and history, power against
its limit, temperature and memory, coloured by thresholds; or why there are no readings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui.widgets import units

HISTORY_WIDTH = 16


def level(value: float | None, warn: float, bad: float, *, low_is_bad: bool = False) -> str:
    """'success' | 'warning' | 'error' for a reading against its thresholds."""
    if value is None:
        return "secondary"
    if low_is_bad:
        return "error" if value < bad else "warning" if value < warn else "success"
    return "error" if value >= bad else "warning" if value >= warn else "success"


def _ratio(used: float | None, total: float | None) -> float | None:
    if used is None or not total:
        return None
    return used / total


def render_gpus(
    gpus: Sequence[Mapping[str, Any]],
    history: Mapping[int, Sequence[float]],
    colours: Mapping[str, str],
    *,
    unavailable: str | None,
) -> RenderableType:
    if unavailable is not None:
        return Text(f"no GPU readings: {unavailable}", style=colours["warning"])
    if not gpus:
        return Text("waiting for the first GPU reading…", style="dim")
    table = Table(box=None, expand=True, padding=(0, 1), header_style="bold")
    for name, justify in (
        ("gpu", "right"),
        ("role", "left"),
        ("util", "left"),
        ("history", "left"),
        ("power W", "right"),
        ("temp", "right"),
        ("mem GiB", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for gpu in gpus:
        util = gpu.get("util")
        util_style = colours[level(util, 70, 30, low_is_bad=True)]
        power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
        power_style = colours[level(_ratio(power, limit), 0.9, 0.98)]
        temp = gpu.get("temp_c")
        mem_used, mem_total = gpu.get("mem_used"), gpu.get("mem_total")
        mem_style = colours[level(_ratio(mem_used, mem_total), 0.85, 0.95)]
        role = str(gpu.get("role", "?"))
        table.add_row(
            str(gpu["index"]),
            Text(role, style=colours["primary"] if role == "drafter" else ""),
            Text(
                f"{units.bar(None if util is None else util / 100, 10)} "
                f"{'–' if util is None else f'{util:3.0f}%'}",
                style=util_style,
            ),
            Text(
                units.sparkline(list(history.get(gpu["index"], ())), HISTORY_WIDTH),
                style=util_style,
            ),
            Text(
                f"{'–' if power is None else f'{power:.0f}'}/"
                f"{'–' if limit is None else f'{limit:.0f}'}",
                style=power_style,
            ),
            Text("–" if temp is None else f"{temp:.0f}°C", style=colours[level(temp, 75, 85)]),
            Text(
                f"{units.mib_as_gib(mem_used)}/{units.mib_as_gib(mem_total)}",
                style=mem_style,
            ),
        )
    return table


class GpuTable(Static):
    BORDER_TITLE = "1 GPUs"
