"""Whole-run history of every plotted metric in bounded, flat memory: per series, buckets of
consecutive steps (min, max, sum, count, first step, last time) at three resolutions. The
coarsest spans the whole run and halves its resolution as the run grows (neighbours merge),
so it always starts at the run's first step; two finer ones keep the recent past for zoomed
ranges. The attach summary's points and live points go through the same path, so the two
meet without a seam. No Textual here: the console and a replay feed it lines' values."""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, replace

from dflash_tui.sources.bucket_level import BatchPlan, BucketLevel, SeriesView

# (bucket width in steps, most buckets kept) of the recent levels: every point of the last
# 4,096 steps (3.3 h of a 180,000-step, six-day run). Another level between it and the
# whole run tripled the cost of a line for a finer 6-hour view; not worth it.
RECENT_LEVELS: tuple[tuple[int, int], ...] = ((1, 4096),)
RECENT_ROWS = 4096
# gpu lines come every 5 s: 1,024 of them are the last 85 minutes at full resolution.
RECENT_GPU_ROWS = 1024
# The whole run: 180,000 steps at 128 steps a bucket, 6 h in about 60 buckets.
WHOLE_BUCKETS = 2048
# Time ranges the plots offer, in seconds (None: the whole run).
RANGES: tuple[tuple[str, float | None], ...] = (
    ("whole run", None),
    ("last 6 h", 6 * 3600.0),
    ("last 1 h", 3600.0),
    ("last 10 min", 600.0),
)
MARKERS_KEPT = 4096
PENDING_POINTS = 256


class MetricHistory:
    """One series at every resolution."""

    __slots__ = ("_pt", "_px", "_py", "last", "last_t", "last_x", "levels", "whole")

    def __init__(
        self,
        recent: tuple[tuple[int, int], ...] = RECENT_LEVELS,
        whole_buckets: int = WHOLE_BUCKETS,
    ) -> None:
        self.levels = [BucketLevel(width, cap) for width, cap in recent]
        self.whole = BucketLevel(1, whole_buckets, merging=True)
        self.levels.append(self.whole)
        self.last: float | None = None
        self.last_x = self.last_t = -math.inf
        # Points wait here and reach the levels in batches (see BucketLevel.extend).
        self._px: list[float] = []
        self._py: list[float] = []
        self._pt: list[float] = []

    def add(self, x: float, y: float, t: float) -> None:
        if y != y:  # NaN: nothing to plot (the trainer writes null, but be safe)
            return
        self._px.append(x)
        self._py.append(y)
        self._pt.append(t)
        self.last = y
        if x > self.last_x:
            self.last_x = x
        if t > self.last_t:
            self.last_t = t
        if len(self._px) >= PENDING_POINTS:
            self.flush()

    def extend(
        self,
        xs: list[float],
        ys: list[float],
        ts: list[float],
        plans: dict[tuple[float, ...], BatchPlan | None] | None = None,
    ) -> None:
        """Points already batched by the caller (a row group), after any pending ones."""
        self.flush()
        for level in self.levels:
            level.extend(xs, ys, ts, plans if level is self.whole else None)
        self.last = ys[-1]
        self.last_x = max(self.last_x, max(xs))
        self.last_t = max(self.last_t, ts[-1])

    def flush(self) -> None:
        if self._px:
            xs, ys, ts = self._px, self._py, self._pt
            self._px, self._py, self._pt = [], [], []
            for level in self.levels:
                level.extend(xs, ys, ts)

    def level_for(self, since_t: float | None) -> BucketLevel:
        """The finest level that reaches back to `since_t` (the whole-run one for None)."""
        self.flush()
        if since_t is not None:
            for level in self.levels[:-1]:
                first = level.first_time()
                if first is not None and first <= since_t:
                    return level
        return self.whole

    def view(self, since_t: float | None, width: int, *, by_time: bool = False) -> SeriesView:
        view = self.level_for(since_t).view(since_t, width, by_time=by_time)
        if not view.xs:
            return view
        return replace(view, last_x=self.last_t if by_time else self.last_x)

    @property
    def first_x(self) -> float | None:
        """The first step on the whole-run plot (without flushing: cheap to ask often)."""
        if len(self.whole):
            return self.whole.x0[0]
        return self._px[0] if self._px else None

    def nbytes(self) -> int:
        """Bytes held by the levels' columns (the pending batch is at most a few KB)."""
        return sum(level.nbytes() for level in self.levels)


@dataclass(frozen=True)
class Marker:
    """A vertical line on the plots: a checkpoint, a (re)start or resume, a run's end."""

    kind: str  # "checkpoint" | "start" | "resume" | "end"
    step: float
    t: float


class RowGroup:
    """Series that arrive together, one row per line (a step line's metrics, a gpu line's
    readings). A row costs two appends: to the recent rows (the fine level of these
    series, read only when a zoomed plot is drawn) and to a batch that reaches the
    whole-run levels every PENDING_POINTS rows."""

    __slots__ = ("_rows", "first_t", "history", "names", "recent")

    def __init__(self, history: RunHistory, names: tuple[str, ...], recent: int) -> None:
        self.history = history
        self.names = names
        self.recent: deque[tuple[float, float, tuple[float | None, ...]]] = deque(maxlen=recent)
        self.first_t: float | None = None
        self._rows: list[tuple[float, float, tuple[float | None, ...]]] = []

    def add(self, x: float, t: float, values: tuple[float | None, ...]) -> None:
        row = (x, t, values)
        self.recent.append(row)
        rows = self._rows
        rows.append(row)
        if self.first_t is None:
            self.first_t = t
        if len(rows) >= PENDING_POINTS:
            self.flush()

    @property
    def last_t(self) -> float | None:
        return self.recent[-1][1] if self.recent else None

    @staticmethod
    def _columns(
        rows: list[tuple[float, float, tuple[float | None, ...]]],
        i: int,
        xs: list[float],
        ts: list[float],
    ) -> tuple[list[float], list[float], list[float]]:
        """Value `i` of each row with its x and t (the shared `xs`, `ts`), nulls left out."""
        ys = [row[2][i] for row in rows]
        if None not in ys:
            return xs, ys, ts  # type: ignore[return-value]
        kept = [(x, y, t) for x, y, t in zip(xs, ys, ts, strict=True) if y is not None]
        if not kept:
            return [], [], []
        cx, cy, ct = (list(c) for c in zip(*kept, strict=True))
        return cx, cy, ct  # type: ignore[return-value]

    def flush(self) -> None:
        rows = self._rows
        if not rows:
            return
        self._rows = []
        xs = [row[0] for row in rows]
        ts = [row[1] for row in rows]
        plans: dict[tuple[float, ...], BatchPlan | None] = {}  # shared by the full columns
        for i, name in enumerate(self.names):
            cx, cy, ct = self._columns(rows, i, xs, ts)
            series = self.history.series_for(name, recent=False)
            if cx and series is not None:
                series.extend(cx, cy, ct, plans if cx is xs else None)

    def recent_view(
        self, name: str, since_t: float, width: int, *, by_time: bool
    ) -> SeriesView | None:
        """`name` from `since_t` on at full resolution, when the recent rows reach back
        that far (else None: the whole-run level answers)."""
        recent = self.recent
        if not recent or recent[0][1] > since_t:
            return None
        start = bisect.bisect_left([row[1] for row in recent], since_t)
        rows = list(recent)[start:]
        xs, ys, ts = self._columns(
            rows, self.names.index(name), [row[0] for row in rows], [row[1] for row in rows]
        )
        level = BucketLevel(1, max(1, len(xs)))
        level.extend(xs, ys, ts)
        view = level.view(None, width, by_time=by_time)
        return replace(view, last_x=(ts if by_time else xs)[-1]) if xs else view

    def first_x(self, name: str) -> float | None:
        i = self.names.index(name)
        return next((row[0] for row in self._rows if row[2][i] is not None), None)


class RunHistory:
    """Every series of a run by name ("loss", "gpu3.util", "stage.drafter_fwd_bwd", ...),
    created on first sight, plus the markers."""

    def __init__(self, *, max_series: int = 256) -> None:
        self.series: dict[str, MetricHistory] = {}
        self.groups: dict[tuple[str, ...], RowGroup] = {}
        self._group_of: dict[str, RowGroup] = {}
        self.markers: deque[Marker] = deque(maxlen=MARKERS_KEPT)
        self.max_series = max_series
        self._first_t: float | None = None
        self._last_t: float | None = None

    def _saw(self, t: float) -> None:
        if self._first_t is None or t < self._first_t:
            self._first_t = t
        if self._last_t is None or t > self._last_t:
            self._last_t = t

    @property
    def first_t(self) -> float | None:
        """Time of the run's first line seen (of any series or marker)."""
        found = [g.first_t for g in self.groups.values() if g.first_t is not None]
        found += [self._first_t] if self._first_t is not None else []
        return min(found) if found else None

    @property
    def last_t(self) -> float | None:
        found = [t for g in self.groups.values() if (t := g.last_t) is not None]
        found += [self._last_t] if self._last_t is not None else []
        return max(found) if found else None

    def series_for(self, name: str, *, recent: bool = True) -> MetricHistory | None:
        """Series `name`, made on first use; `recent=False`: its recent points are kept
        by its row group, so it holds only the whole-run level."""
        series = self.series.get(name)
        if series is None:
            if len(self.series) >= self.max_series:
                return None  # a runaway writer inventing names must not grow us unbounded
            series = self.series[name] = MetricHistory(RECENT_LEVELS if recent else ())
        return series

    def group(self, names: tuple[str, ...], *, recent: int = RECENT_ROWS) -> RowGroup:
        """The row group of these series (made once; hold on to it for the fast path),
        keeping its newest `recent` rows whole."""
        group = self.groups.get(names)
        if group is None:
            group = self.groups[names] = RowGroup(self, names, recent)
            for name in names:
                self._group_of[name] = group
        return group

    def add(self, name: str, x: float, y: float | None, t: float) -> None:
        if y is None:
            return
        series = self.series_for(name)
        if series is not None:
            series.add(x, float(y), t)
            self._saw(t)

    def flush(self) -> None:
        for group in self.groups.values():
            group.flush()

    def first_x(self, name: str) -> float | None:
        """The first step on the whole-run plot of `name`, cheap to ask after every line."""
        series = self.series.get(name)
        if series is not None and series.first_x is not None:
            return series.first_x
        for group in self.groups.values():
            if name in group.names:
                return group.first_x(name)
        return None

    def mark(self, kind: str, step: float, t: float) -> None:
        self.markers.append(Marker(kind, step, t))
        self._saw(t)

    def since(self, span_s: float | None) -> float | None:
        """The start time of the newest `span_s` seconds of the run (by the stream's clock,
        so a replay or a frozen test clock reads the same)."""
        if span_s is None or self.last_t is None:
            return None
        return self.last_t - span_s

    def view(
        self, name: str, since_t: float | None, width: int, *, by_time: bool = False
    ) -> SeriesView:
        """Series `name` from `since_t` (see `since`; None: the whole run) to now."""
        group = self._group_of.get(name)
        if group is not None and since_t is not None:
            view = group.recent_view(name, since_t, width, by_time=by_time)
            if view is not None:
                return view
        self.flush()
        series = self.series.get(name)
        if series is None:
            return SeriesView([], [], [], [])
        return series.view(since_t, width, by_time=by_time)

    def markers_in(self, since_t: float | None) -> list[Marker]:
        return [m for m in self.markers if since_t is None or m.t >= since_t]

    def names(self, prefix: str = "") -> list[str]:
        self.flush()
        return sorted(name for name in self.series if name.startswith(prefix))

    def nbytes(self) -> int:
        self.flush()
        return sum(series.nbytes() for series in self.series.values())
