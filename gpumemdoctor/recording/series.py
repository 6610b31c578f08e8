"""A bounded timeline: the whole run's shape in a fixed number of points, however long it runs.

Points arrive in time order. The first `head` points are kept as they came (warm-up, the
CUDA context, the start of any growth), and so are the last `tail` (the end of the run) and
`window` points either side of each marked event (an out-of-memory error, growth first
suspected), up to `events` of them. Between those, consecutive points are gathered into
at most `buckets` buckets. A bucket keeps real points, not averages: its first and its last,
and, for each figure it follows, the point where that figure was lowest and the one where it
was highest, so the floor that growth is judged on and every spike survive. When there are
too many buckets, neighbours merge pairwise and new buckets take twice as many points.

So memory and `points()` are bounded by head + tail + events * 2 * window +
(buckets + events + 1) * (2 + 2 * figures), whether the run lasted a minute or a week.
Adding a point costs O(1) (amortised: a merge walks the buckets once per doubling). Pure.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Generic, Iterable, TypeVar

P = TypeVar("P")

HEAD = 256
TAIL = 256
BUCKETS = 256
WINDOW = 64
EVENTS = 8


def _time_of_pair(point: Any) -> float:
    return point[0]


def _value_of_pair(point: Any) -> tuple:
    return (point[1],)


class _Bucket:
    """Consecutive points, kept as first, last, and the lowest and highest of each figure."""

    __slots__ = ("first", "last", "count", "low", "high")

    def __init__(self, point: Any, figures: tuple):
        self.first = self.last = point
        self.count = 1
        self.low: dict = {}
        self.high: dict = {}
        self._take(point, figures)

    def _take(self, point: Any, figures: tuple) -> None:
        low, high = self.low, self.high
        for i, value in enumerate(figures):
            if value is None:
                continue
            kept = low.get(i)
            if kept is None or value < kept[0]:
                low[i] = (value, point)
            kept = high.get(i)
            if kept is None or value > kept[0]:
                high[i] = (value, point)

    def add(self, point: Any, figures: tuple) -> None:
        self.last = point
        self.count += 1
        self._take(point, figures)

    def absorb(self, later: _Bucket) -> None:
        self.last = later.last
        self.count += later.count
        for i, (value, point) in later.low.items():
            if i not in self.low or value < self.low[i][0]:
                self.low[i] = (value, point)
        for i, (value, point) in later.high.items():
            if i not in self.high or value > self.high[i][0]:
                self.high[i] = (value, point)

    def points(self, time_of: Callable) -> list:
        unique = {id(p): p for p in (self.first, *(v[1] for v in self.low.values()),
                                     *(v[1] for v in self.high.values()), self.last)}
        return sorted(unique.values(), key=time_of)


class Series(Generic[P]):
    """A timeline that keeps a bounded number of points; see the module's docstring."""

    def __init__(self, time_of: Callable[[P], float] = _time_of_pair,
                 figures: Callable[[P], tuple] = _value_of_pair, head: int = HEAD, tail: int = TAIL,
                 buckets: int = BUCKETS, window: int = WINDOW, events: int = EVENTS):
        if min(head, tail, window, events) < 0 or buckets < 2:
            raise ValueError("a series needs at least 2 buckets and no negative sizes")
        self._time_of = time_of
        self._figures = figures
        self._head_size = head
        self._max_buckets = buckets
        self._window = window
        self._max_events = events
        self._head: list = []
        # The tail also holds the points before an event until mark() has claimed them.
        self._tail: deque = deque(maxlen=max(tail, window, 1))
        self._middle: list = []  # _Bucket, or a list of points kept as they came, in time order
        self._buckets = 0
        self.bucket_points = 1  # points a new bucket takes before the next one starts
        self._settled = 0  # points that have left the tail (or stayed in the head)
        self._keep: deque = deque()  # [first, end) indexes of points to keep as they came
        self.events: list[tuple[str, float]] = []  # (label, time) of marked events, at most `events`
        self.events_dropped = 0
        self.seen = 0
        self.last: P | None = None

    # -- adding ---------------------------------------------------------------
    def add(self, point: P) -> None:
        self.seen += 1
        self.last = point
        if len(self._head) < self._head_size:
            self._head.append(point)
            self._settled += 1
            return
        if len(self._tail) == self._tail.maxlen:
            self._settle(self._tail[0])
        self._tail.append(point)

    def extend(self, points: Iterable[P]) -> None:
        for point in points:
            self.add(point)

    def mark(self, label: str, t: float | None = None) -> None:
        """Keep `window` points either side of now as they are (an event worth full detail)."""
        if len(self.events) >= self._max_events:
            self.events_dropped += 1
            return
        if t is None:
            t = self._time_of(self.last) if self.last is not None else 0.0
        self.events.append((label, t))
        first, end = max(0, self.seen - self._window), self.seen + self._window
        if self._keep and first <= self._keep[-1][1]:
            self._keep[-1][1] = max(self._keep[-1][1], end)
        else:
            self._keep.append([first, end])

    def _settle(self, point: P) -> None:
        """A point leaves the tail: into a detail run, or into the current bucket."""
        index = self._settled
        self._settled += 1
        keep = self._keep
        while keep and keep[0][1] <= index:
            keep.popleft()
        middle = self._middle
        if keep and keep[0][0] <= index:
            if middle and isinstance(middle[-1], list):
                middle[-1].append(point)
            else:
                middle.append([point])
            return
        last = middle[-1] if middle else None
        if isinstance(last, _Bucket) and last.count < self.bucket_points:
            last.add(point, self._figures(point))
            return
        middle.append(_Bucket(point, self._figures(point)))
        self._buckets += 1
        if self._buckets > self._max_buckets:
            self._merge()

    def _merge(self) -> None:
        """Neighbouring buckets merge pairwise; a detail run between two keeps them apart."""
        merged: list = []
        waiting = None  # a bucket whose partner has not come yet
        for item in self._middle:
            if isinstance(item, _Bucket):
                if waiting is None:
                    waiting = item
                else:
                    waiting.absorb(item)
                    merged.append(waiting)
                    waiting = None
                continue
            if waiting is not None:
                merged.append(waiting)
                waiting = None
            merged.append(item)
        if waiting is not None:
            merged.append(waiting)
        self._middle = merged
        self._buckets = sum(isinstance(item, _Bucket) for item in merged)
        self.bucket_points *= 2

    # -- reading --------------------------------------------------------------
    def points(self) -> list[P]:
        """The kept points in time order: all of the head, the detail runs and the tail, and
        each bucket's first, last, lowest and highest."""
        out = list(self._head)
        for item in self._middle:
            out.extend(item if isinstance(item, list) else item.points(self._time_of))
        out.extend(self._tail)
        return out

    @property
    def kept(self) -> int:
        return len(self.points())

    def summary(self) -> dict:
        """How the series was kept: points seen and kept, points per bucket, the marked events."""
        return {"seen": self.seen, "kept": self.kept, "bucket_points": self.bucket_points,
                "events": [[label, round(t, 6)] for label, t in self.events]}
