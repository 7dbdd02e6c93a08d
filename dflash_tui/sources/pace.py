"""A run's pace and the ETA it gives, the same in every view (dashboard, fleet, replay):
seconds per step over the newest steps of the current segment (since the last start or
resume), the gaps of stalls left out, so a stall or a restart does not skew the estimate
for the hours after it."""

from __future__ import annotations

from collections import deque

# Step intervals the pace is taken over: recent enough to follow a changed speed.
PACE_WINDOW = 50
# A gap this long between two step lines is a stall (or a pause), not the run's pace.
GAP_S = 60.0


class SegmentPace:
    """Feed it the run's live step lines (`add`) and each (re)start (`restart`)."""

    def __init__(self, window: int = PACE_WINDOW, gap_s: float = GAP_S) -> None:
        self.gap_s = gap_s
        self._intervals: deque[tuple[int, float]] = deque(maxlen=window)
        self._last: tuple[int, float] | None = None

    def restart(self) -> None:
        self._intervals.clear()
        self._last = None

    def add(self, step: int, t: float) -> None:
        last, self._last = self._last, (step, t)
        if last is None:
            return
        steps, seconds = step - last[0], t - last[1]
        if steps <= 0:
            # The step count went back (a resume from an older checkpoint): a new segment.
            self._intervals.clear()
            return
        if 0 < seconds <= self.gap_s * steps:
            self._intervals.append((steps, seconds))

    @property
    def steps_per_s(self) -> float | None:
        steps = sum(s for s, _ in self._intervals)
        seconds = sum(t for _, t in self._intervals)
        return steps / seconds if steps and seconds > 0 else None


def eta_s(steps_per_s: float | None, step: object, total: object) -> float | None:
    """Seconds until `total` steps at the pace; None without a pace or the counts (a
    caller shows no ETA unless the run is running)."""
    if not steps_per_s or not isinstance(step, int) or not isinstance(total, int):
        return None
    return max(0.0, (total - step) / steps_per_s)
