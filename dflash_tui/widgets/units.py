"""How numbers, durations and bars read on screen, shared by the panes."""

from __future__ import annotations

import math

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def number(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if value != 0 and (abs(value) >= 10**digits or abs(value) < 10 ** -(digits - 1)):
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def token_rate(value: object) -> str:
    """Tokens a second: a decimal below 10 (a loaded CPU), whole numbers above."""
    rate = float(value) if isinstance(value, (int, float)) else 0.0
    return f"{rate:,.1f}" if rate < 10 else f"{rate:,.0f}"


def percent(fraction: float | None) -> str:
    if fraction is None or not math.isfinite(fraction):
        return "–"
    return f"{100 * fraction:.0f}%"


def bar(fraction: float | None, width: int) -> str:
    """A left-to-right bar in eighths of a cell."""
    if fraction is None or not math.isfinite(fraction) or width <= 0:
        return " " * max(width, 0)
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + ("" if part == 0 else "▏▎▍▌▋▊▉"[part - 1])
    return text.ljust(width, "·")


def sparkline(values: list[float], width: int, top: float = 100.0) -> str:
    """The last `width` values on a 0..top scale."""
    tail = values[-width:] if width > 0 else []
    chars = []
    for v in tail:
        if v is None or not math.isfinite(v):
            chars.append(" ")
            continue
        idx = int(max(0.0, min(1.0, v / top)) * (len(SPARK_CHARS) - 1) + 0.5)
        chars.append(SPARK_CHARS[idx])
    return "".join(chars).rjust(width)


def mib_as_gib(value: float | None) -> str:
    """NVML readings arrive in MiB; GiB with one decimal reads better on a wide GPU."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value / 1024:.1f}"
