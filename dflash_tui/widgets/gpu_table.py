"""The GPU pane: one row per GPU with its role, utilization bar and history, power against
its limit, temperature and memory, coloured by thresholds; or why there are no readings."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static

from dflash_tui.widgets import units

HISTORY_WIDTH = 16
UTIL_BAR_WIDTH = 10
# Processes listed under a GPU's row (who holds it: why a launch met gpu_busy).
MAX_PROCESSES = 3
ROLE_WIDTH = 8
# A GPU that holds a target replica and a drafter rank (DDP on a small box) in the role column.
ROLE_LABELS = {"target+drafter": "tgt+dft"}


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


@dataclass(frozen=True)
class Columns:
    """How wide the util bar and the history are, and whether power and memory show their
    limits (`650/700`, `127.0/140.4`) or only the reading."""

    bar: int = UTIL_BAR_WIDTH
    history: int = HISTORY_WIDTH
    limits: bool = True

    @property
    def power(self) -> int:
        return 9 if self.limits else 5

    @property
    def memory(self) -> int:
        return 13 if self.limits else 6

    def header(self) -> str:
        history = f"{'history':<{self.history}}  " if self.history else ""
        power, memory = ("power W", "mem GiB") if self.limits else ("W", "GiB")
        return (
            f"{'gpu':>3}  {'role':<{ROLE_WIDTH}} {'util':<{self.bar + 5}}  {history}"
            f"{power:>{self.power}}  {'temp':>5}  {memory:>{self.memory}}"
        )


# Widest first: the history goes first (the GPU history pane shows it too), then the util
# bar narrows to 3, then power and memory drop their limits.
LAYOUTS = (
    Columns(),
    *(Columns(bar=bar, history=0) for bar in range(UTIL_BAR_WIDTH, 2, -1)),
    *(Columns(bar=bar, history=0, limits=False) for bar in range(UTIL_BAR_WIDTH, 2, -1)),
)


@functools.cache
def columns_for(width: int | None) -> Columns:
    """The widest layout that fits `width` cells (0 or None: not laid out yet, the full)."""
    if not width:
        return LAYOUTS[0]
    return next((c for c in LAYOUTS if len(c.header()) <= width), LAYOUTS[-1])


def render_gpus(
    gpus: Sequence[Mapping[str, Any]],
    history: Mapping[int, Sequence[float]],
    colours: Mapping[str, str],
    *,
    unavailable: str | None,
    width: int | None = None,
) -> RenderableType:
    """`width`: the pane's content width (columns_for); a row is never wrapped into a
    second line that would read as another GPU."""
    if unavailable is not None:
        return Text(f"no GPU readings: {unavailable}", style=colours["warning"])
    if not gpus:
        return Text("waiting for the first GPU reading…", style="dim")
    cols = columns_for(width)
    # Plain padded text rather than a rich Table: this pane redraws every monitor tick and
    # a Table's measuring pass costs several times more.
    lines = [Text(cols.header(), style="bold", no_wrap=True)]
    for gpu in gpus:
        util = gpu.get("util")
        util_style = colours[level(util, 70, 30, low_is_bad=True)]
        power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
        temp = gpu.get("temp_c")
        mem_used, mem_total = gpu.get("mem_used"), gpu.get("mem_total")
        role = str(gpu.get("role") or "–")
        role = ROLE_LABELS.get(role, role)[:ROLE_WIDTH]
        util_text = "   –" if util is None else f"{util:3.0f}%"
        watts = f"{_num(power)}/{_num(limit)}" if cols.limits else _num(power)
        memory = units.mib_as_gib(mem_used)
        if cols.limits:
            memory += f"/{units.mib_as_gib(mem_total)}"
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{gpu['index']:>3}  ")
        line.append(
            f"{role:<{ROLE_WIDTH}} ",
            style=colours["primary"] if "drafter" in str(gpu.get("role")) else "",
        )
        line.append(
            f"{units.bar(None if util is None else util / 100, cols.bar)} {util_text}  ",
            style=util_style,
        )
        if cols.history:
            history_text = units.sparkline(list(history.get(gpu["index"], ())), cols.history)
            line.append(history_text + "  ", style=util_style)
        line.append(
            f"{watts:>{cols.power}}  ", style=colours[level(_ratio(power, limit), 0.9, 0.98)]
        )
        line.append(
            f"{_num(temp) + '°C' if temp is not None else '–':>5}  ",
            style=colours[level(temp, 75, 85)],
        )
        line.append(
            f"{memory:>{cols.memory}}",
            style=colours[level(_ratio(mem_used, mem_total), 0.85, 0.95)],
        )
        lines.append(line)
        lines.extend(_process_rows(gpu.get("processes")))
    return Text("\n", no_wrap=True, overflow="ellipsis").join(lines)


def _process_rows(processes: Any) -> list[Text]:
    if not isinstance(processes, list) or not processes:
        return []
    rows = []
    for proc in processes[:MAX_PROCESSES]:
        if not isinstance(proc, Mapping):
            continue
        name = str(proc.get("name") or "?")[:24]
        mem = proc.get("gpu_mem")
        held = f"{mem / 1024:.1f} GiB" if isinstance(mem, (int, float)) else "– GiB"
        rows.append(Text(f"     └ pid {proc.get('pid')} {name} {held}", style="dim", no_wrap=True))
    if len(processes) > MAX_PROCESSES:
        rows.append(Text(f"     └ … {len(processes) - MAX_PROCESSES} more", style="dim"))
    return rows


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


class GpuTable(Static):
    BORDER_TITLE = "1 GPUs"
