"""Whole-run history of every plotted metric in bounded, flat memory: per series, buckets of
consecutive steps (min, max, sum, count, first step, last time) at three resolutions. The
coarsest spans the whole run and halves its resolution as the run grows (neighbours merge),
so it always starts at the run's first step; two finer ones keep the recent past for zoomed
ranges. The attach summary's points and live points go through the same path, so the two
meet without a seam. No Textual here: the console and a replay feed it lines' values."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

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


@dataclass(frozen=True)
class SeriesView:
    """A series over a range, at most `width` columns: per column its first step (or time),
    lowest, highest and mean value."""

    xs: list[float]
    lows: list[float]
    highs: list[float]
    means: list[float]
    last_x: float | None = None  # the newest point's x: where the plot ends

    def __len__(self) -> int:
        return len(self.xs)

    def envelope(self) -> tuple[list[float], list[float]]:
        """Raw points for a line plot: each column's low and high in turn, spikes kept."""
        xs: list[float] = []
        ys: list[float] = []
        for x, lo, hi in zip(self.xs, self.lows, self.highs, strict=True):
            xs.append(x)
            ys.append(lo)
            if hi != lo:
                xs.append(x)
                ys.append(hi)
        return xs, ys


@dataclass(frozen=True)
class _Plan:
    """Where a batch of points goes in a level: the first `head` join its newest bucket;
    then a bucket per run from each of `starts` to its `ends` (None: one per point), with
    first steps `x0` and newest times `t`."""

    head: int
    head_t: float
    starts: list[int] | None
    ends: list[int] | None
    x0: list[float]
    t: list[float]
    last_key: float


class BucketLevel:
    """Buckets of `width` consecutive steps in parallel flat arrays. A step at or below the
    newest bucket's (a resumed run repeating steps) joins the newest bucket, so x stays in
    order. `cap`: a recent level drops its oldest buckets beyond it; a whole-run level
    (`merging`) doubles its width and merges neighbours instead."""

    __slots__ = ("_key", "cap", "hi", "lo", "merging", "n", "t", "total", "width", "x0")

    def __init__(self, width: int, cap: int, *, merging: bool = False) -> None:
        self.width = width
        self.cap = cap
        self.merging = merging
        self.x0 = array("d")  # first step of the bucket
        self.t = array("d")  # time of its newest point
        self.lo = array("d")
        self.hi = array("d")
        self.total = array("d")
        self.n = array("d")
        self._key = -math.inf

    def __len__(self) -> int:
        return len(self.x0)

    def add(self, x: float, y: float, t: float) -> None:
        self.extend([x], [y], [t])

    def extend(
        self,
        xs: list[float],
        ys: list[float],
        ts: list[float],
        plans: dict[tuple[float, ...], _Plan | None] | None = None,
    ) -> None:
        """Add points in x order (a point at or below the newest bucket's key joins it).
        Runs of points that share a bucket are reduced with builtins, not point by point:
        this runs for every series of every line. Series of one row group share `xs`, and
        with it the plan of which points go where (`plans`, filled by the first)."""
        if not xs:
            return
        key = (self.width, self._key, float(len(self.x0) > 0))
        if plans is not None and key in plans:
            plan = plans[key]
        else:
            plan = self._plan(xs, ts)
            if plans is not None:
                plans[key] = plan
        if plan is None:
            for x, y, t in zip(xs, ys, ts, strict=True):  # a resume repeating steps
                self.extend([x], [y], [t])
            return
        self._apply(plan, ys)
        if len(self.x0) > self.cap:
            if self.merging:
                self._halve()
            elif len(self.x0) >= self.cap + max(1, self.cap // 4):
                # Trim in batches: deleting the head of an array copies it.
                self._drop(len(self.x0) - self.cap)

    def _plan(self, xs: list[float], ts: list[float]) -> _Plan | None:
        """None for points out of order; else where each goes (see `_Plan`)."""
        if xs != sorted(xs):
            return None
        width = self.width
        if width == 1 and xs[0] > self._key and len(set(xs)) == len(xs):
            # One bucket per point (the raw level, or a whole-run level still at full
            # resolution): the columns go in as they are.
            return _Plan(0, 0.0, None, None, xs, ts, xs[-1] // 1)
        # Points of the newest bucket's key (a prefix: xs are in order) join it.
        head = bisect.bisect_left(xs, (self._key + 1) * width) if self.x0 else 0
        head_t = ts[head - 1] if head else 0.0
        if head == len(xs):
            return _Plan(head, head_t, [], [], [], [], self._key)
        rest = xs[head:]
        starts, last_key = _run_starts(rest, width)
        starts = [head + a for a in starts]
        ends = [*starts[1:], len(xs)]
        return _Plan(
            head, head_t, starts, ends, [xs[a] for a in starts], [ts[b - 1] for b in ends], last_key
        )

    def _apply(self, plan: _Plan, ys: list[float]) -> None:
        if plan.starts is None:
            self.x0.fromlist(plan.x0)
            self.t.fromlist(plan.t)
            self.lo.fromlist(ys)
            self.hi.fromlist(ys)
            self.total.fromlist(ys)
            self.n.fromlist([1.0] * len(ys))
            self._key = plan.last_key
            return
        head = plan.head
        if head:
            run = ys[:head]
            k = len(self.x0) - 1
            self.lo[k] = min(self.lo[k], min(run))
            self.hi[k] = max(self.hi[k], max(run))
            self.total[k] += sum(run)
            self.n[k] += head
            self.t[k] = max(self.t[k], plan.head_t)
        if plan.starts:
            assert plan.ends is not None
            chunks = [ys[a:b] for a, b in zip(plan.starts, plan.ends, strict=True)]
            self.x0.fromlist(plan.x0)
            self.t.fromlist(plan.t)
            self.lo.fromlist(list(map(min, chunks)))
            self.hi.fromlist(list(map(max, chunks)))
            self.total.fromlist(list(map(sum, chunks)))
            self.n.fromlist([float(b - a) for a, b in zip(plan.starts, plan.ends, strict=True)])
        self._key = plan.last_key

    def _drop(self, count: int) -> None:
        for column in (self.x0, self.t, self.lo, self.hi, self.total, self.n):
            del column[:count]

    def _halve(self) -> None:
        while len(self.x0) > self.cap:
            self.width *= 2
            if self._halve_pairs():
                continue
            starts, last_key = _run_starts(self.x0, self.width)
            spans = list(zip(starts, [*starts[1:], len(self.x0)], strict=True))
            x0, t, lo, hi, total, n = self.x0, self.t, self.lo, self.hi, self.total, self.n
            self.x0 = array("d", [x0[a] for a in starts])
            self.t = array("d", [t[b - 1] for _, b in spans])
            self.lo = array("d", [min(lo[a:b]) for a, b in spans])
            self.hi = array("d", [max(hi[a:b]) for a, b in spans])
            self.total = array("d", [sum(total[a:b]) for a, b in spans])
            self.n = array("d", [sum(n[a:b]) for a, b in spans])
            self._key = last_key

    def _halve_pairs(self) -> bool:
        """The common case, a bucket for every key (a live run): neighbours merge two by
        two, column against column at C speed. False, with nothing changed, otherwise."""
        count, old = len(self.x0), self.width // 2
        first, last = self.x0[0] // old, self.x0[-1] // old
        if last - first != count - 1:
            return False
        lone = int(first) % 2  # an odd first key has no partner
        pairs = (count - lone) // 2
        end = lone + 2 * pairs
        columns = {}
        for name, merge in (("lo", min), ("hi", max), ("total", operator.add), ("n", operator.add)):
            column = getattr(self, name)
            merged = array("d", column[:lone])
            merged.fromlist(list(map(merge, column[lone:end:2], column[lone + 1 : end : 2])))
            merged.extend(column[end:])
            columns[name] = merged
        x0 = array("d", self.x0[:lone])
        x0.extend(self.x0[lone:end:2])
        x0.extend(self.x0[end:])
        t = array("d", self.t[:lone])
        t.extend(self.t[lone + 1 : end : 2])
        t.extend(self.t[end:])
        self.x0, self.t = x0, t
        self.lo, self.hi, self.total, self.n = (columns[k] for k in ("lo", "hi", "total", "n"))
        self._key = self.x0[-1] // self.width
        return True

    def first_time(self) -> float | None:
        return self.t[0] if self.t else None

    def start_index(self, since_t: float | None) -> int:
        """Index of the first bucket whose newest point is at or after `since_t`."""
        if since_t is None:
            return 0
        times = self.t
        lo, hi = 0, len(times)
        while lo < hi:  # times rise (a bucket's newest point is never older than the last)
            mid = (lo + hi) // 2
            if times[mid] < since_t:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def view(self, since_t: float | None, width: int, *, by_time: bool) -> SeriesView:
        """The buckets from `since_t` on, grouped into at most `width` columns of equal
        span on the x axis (steps, or time with `by_time`)."""
        start, end = self.start_index(since_t), len(self.x0)
        xs: list[float] = []
        lows: list[float] = []
        highs: list[float] = []
        means: list[float] = []
        counts: list[float] = []
        if start >= end:
            return SeriesView(xs, lows, highs, means)
        source = self.t if by_time else self.x0
        first, span = source[start], source[end - 1] - source[start]
        columns = max(1, width)
        scale = columns / span if span > 0 and end - start > columns else 0.0
        column = -1
        for i in range(start, end):
            c = min(columns - 1, int((source[i] - first) * scale)) if scale else i
            if c != column:
                column = c
                xs.append(source[i])
                lows.append(self.lo[i])
                highs.append(self.hi[i])
                means.append(self.total[i])
                counts.append(self.n[i])
                continue
            if self.lo[i] < lows[-1]:
                lows[-1] = self.lo[i]
            if self.hi[i] > highs[-1]:
                highs[-1] = self.hi[i]
            means[-1] += self.total[i]
            counts[-1] += self.n[i]
        means = [m / n for m, n in zip(means, counts, strict=True)]
        return SeriesView(xs, lows, highs, means, source[end - 1])

    def nbytes(self) -> int:
        return sum(
            c.buffer_info()[1] * c.itemsize
            for c in (self.x0, self.t, self.lo, self.hi, self.total, self.n)
        )


def _run_starts(xs: Sequence[float], width: int) -> tuple[list[int], float]:
    """Where each run of equal keys (x // width) starts in the sorted `xs`, and the last
    key: by bisection when runs are long, by one comparison a point when they are short."""
    if width < 16:
        keys = [x // width for x in xs]
        starts = [0]
        starts += [i for i, (a, b) in enumerate(itertools.pairwise(keys), 1) if a != b]
        return starts, keys[-1]
    starts, i, count = [0], 0, len(xs)
    while True:
        key = xs[i] // width
        i = bisect.bisect_left(xs, (key + 1) * width, i)
        if i >= count:
            return starts, key
        starts.append(i)


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
        plans: dict[tuple[float, ...], _Plan | None] | None = None,
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
        plans: dict[tuple[float, ...], _Plan | None] = {}  # shared by the full columns
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
