"""The GPU pane: one row per GPU with its role, utilization bar and history, power against
its limit, temperature and memory, coloured by thresholds; or why there are no readings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static

from dflash_tui.widgets import units

HISTORY_WIDTH = 16
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
    # Plain padded text rather than a rich Table: this pane redraws every monitor tick and
    # a Table's measuring pass costs several times more.
    lines = [Text(HEADER, style="bold", no_wrap=True)]
    for gpu in gpus:
        util = gpu.get("util")
        util_style = colours[level(util, 70, 30, low_is_bad=True)]
        power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
        temp = gpu.get("temp_c")
        mem_used, mem_total = gpu.get("mem_used"), gpu.get("mem_total")
        role = str(gpu.get("role") or "–")
        role = ROLE_LABELS.get(role, role)[:ROLE_WIDTH]
        util_text = "   –" if util is None else f"{util:3.0f}%"
        watts = f"{_num(power)}/{_num(limit)}"
        memory = f"{units.mib_as_gib(mem_used)}/{units.mib_as_gib(mem_total)}"
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{gpu['index']:>3}  ")
        line.append(
            f"{role:<{ROLE_WIDTH}} ",
            style=colours["primary"] if "drafter" in str(gpu.get("role")) else "",
        )
        line.append(
            f"{units.bar(None if util is None else util / 100, 10)} {util_text}  ", style=util_style
        )
        history_text = units.sparkline(list(history.get(gpu["index"], ())), HISTORY_WIDTH)
        line.append(history_text + "  ", style=util_style)
        line.append(f"{watts:>9}  ", style=colours[level(_ratio(power, limit), 0.9, 0.98)])
        line.append(
            f"{_num(temp) + '°C' if temp is not None else '–':>5}  ",
            style=colours[level(temp, 75, 85)],
        )
        line.append(f"{memory:>13}", style=colours[level(_ratio(mem_used, mem_total), 0.85, 0.95)])
        lines.append(line)
        lines.extend(_process_rows(gpu.get("processes")))
    return Text("\n").join(lines)


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


HEADER = (
    f"{'gpu':>3}  {'role':<{ROLE_WIDTH}} {'util':<15}  {'history':<{HISTORY_WIDTH}}  "
    f"{'power W':>9}  {'temp':>5}  {'mem GiB':>13}"
)


class GpuTable(Static):
    BORDER_TITLE = "1 GPUs"
