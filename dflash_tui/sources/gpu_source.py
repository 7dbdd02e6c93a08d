"""Which GPU readings the pane shows, so it never shows a frozen past as the present: the
trainer's own `gpu` lines (they name each GPU's role in the run) while they keep coming,
and the box's `dflash-train gpus --follow` readings once the trainer's are older than two
of its monitor ticks (a hung or killed trainer writes nothing) or no run is live. No UI."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dflash_train.protocol import StatusLine

DEFAULT_TICK_S = 5.0  # the trainer's monitor writes a gpu line this often by default
STALE_TICKS = 2


@dataclass(frozen=True)
class GpuSourceView:
    """What the pane says about its readings: whose they are and how old."""

    source: str  # "trainer" | "box" | "none"
    age_s: float | None
    trainer_age_s: float | None

    def describe(self) -> str:
        if self.source == "none":
            return ""
        age = "" if self.age_s is None else f" · {self.age_s:.0f} s old"
        if self.source == "trainer":
            return f"trainer's readings{age}"
        why = (
            f"trainer silent {self.trainer_age_s:.0f} s"
            if self.trainer_age_s is not None
            else "no trainer readings"
        )
        return f"box `gpus --follow`{age} ({why})"


class GpuSourcePicker:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.tick_s = DEFAULT_TICK_S
        self._trainer_at: float | None = None  # arrival of the trainer's last gpu line
        self._trainer_t: float | None = None  # its own timestamp, for the tick estimate
        self._roles: dict[int, str] = {}
        self._box_at: float | None = None
        self.showing = "none"

    def trainer_reading(self, line: StatusLine) -> None:
        if self._trainer_t is not None and line.get("history") is not True:
            gap = line.t - self._trainer_t
            if 0.5 <= gap <= 120:
                # The monitor's interval, followed as it is (it is configurable).
                self.tick_s = 0.7 * self.tick_s + 0.3 * gap
        self._trainer_t = line.t
        if line.get("history") is True:
            return  # a summary of the past says nothing about the trainer being alive now
        self._trainer_at = self.clock()
        self._roles = {
            g["index"]: str(g.get("role") or "") for g in line["gpus"] if isinstance(g, dict)
        }
        self.showing = "trainer"

    def date_back(self, written_at: Callable[[float], float]) -> None:
        """Date the trainer's last reading from when it was written, not when it arrived:
        `written_at` maps a line's own time to the console's clock (the history's end marker
        says how long the stream had been silent). A reading sent on attach is as old as
        its line."""
        if self._trainer_at is not None and self._trainer_t is not None:
            self._trainer_at = min(self._trainer_at, written_at(self._trainer_t))

    def trainer_is_current(self, run_live: bool, now: float | None = None) -> bool:
        if not run_live or self._trainer_at is None:
            return False
        now = self.clock() if now is None else now
        return now - self._trainer_at <= STALE_TICKS * self.tick_s

    def box_reading(self, line: StatusLine, *, run_live: bool) -> StatusLine | None:
        """The box's reading to show (roles filled in from the trainer's last line), or
        None while the trainer's own readings are current."""
        if self.trainer_is_current(run_live):
            return None
        self._box_at = self.clock()
        self.showing = "box"
        if not self._roles:
            return line
        gpus: list[Any] = []
        for gpu in line["gpus"]:
            if isinstance(gpu, dict) and not gpu.get("role") and gpu.get("index") in self._roles:
                gpu = {**gpu, "role": self._roles[gpu["index"]]}
            gpus.append(gpu)
        return replace(line, fields={**line.fields, "gpus": gpus})

    def view(self, now: float | None = None) -> GpuSourceView:
        now = self.clock() if now is None else now
        trainer_age = None if self._trainer_at is None else max(0.0, now - self._trainer_at)
        if self.showing == "trainer":
            return GpuSourceView("trainer", trainer_age, trainer_age)
        if self.showing == "box":
            box_age = None if self._box_at is None else max(0.0, now - self._box_at)
            return GpuSourceView("box", box_age, trainer_age)
        return GpuSourceView("none", None, trainer_age)
