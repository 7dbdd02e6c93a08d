"""One resolution of a metric's history: buckets of `width` consecutive steps (min, max, sum,
count, first step, newest time) in flat arrays, filled a batch of points at a time, and the
view of a range at most a plot's width wide. run_history.py keeps several per series."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass


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
class BatchPlan:
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
        plans: dict[tuple[float, ...], BatchPlan | None] | None = None,
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

    def _plan(self, xs: list[float], ts: list[float]) -> BatchPlan | None:
        """None for points out of order; else where each goes (see `BatchPlan`)."""
        if xs != sorted(xs):
            return None
        width = self.width
        if width == 1 and xs[0] > self._key and len(set(xs)) == len(xs):
            # One bucket per point (the raw level, or a whole-run level still at full
            # resolution): the columns go in as they are.
            return BatchPlan(0, 0.0, None, None, xs, ts, xs[-1] // 1)
        # Points of the newest bucket's key (a prefix: xs are in order) join it.
        head = bisect.bisect_left(xs, (self._key + 1) * width) if self.x0 else 0
        head_t = ts[head - 1] if head else 0.0
        if head == len(xs):
            return BatchPlan(head, head_t, [], [], [], [], self._key)
        rest = xs[head:]
        starts, last_key = _run_starts(rest, width)
        starts = [head + a for a in starts]
        ends = [*starts[1:], len(xs)]
        return BatchPlan(
            head, head_t, starts, ends, [xs[a] for a in starts], [ts[b - 1] for b in ends], last_key
        )

    def _apply(self, plan: BatchPlan, ys: list[float]) -> None:
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
