"""Downsampling a long series for a chart, keeping each bucket's lowest and highest point. Pure."""
from __future__ import annotations

from typing import Sequence

Point = tuple  # (t, value): value None where it was not available


def envelope(points: Sequence[Point], buckets: int) -> list[Point]:
    """At most about 2 * buckets + 2 of `points`, sorted by t, with every spike and every floor kept.

    The time span is cut into `buckets` equal slices; of the points in a slice, the lowest and the
    highest are kept, in the order they came. A plain average or every n-th point would lose the
    one-sample spike (an out-of-memory moment) or the floor (what a leak is judged on); this keeps
    both, so a chart of the result has the same peaks and the same floors as one of all the points.
    The first and the last point are always kept. Points whose value is None are dropped when the
    series is cut down (a series short enough is returned whole, gaps included).
    """
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    if len(points) <= 2 * buckets + 2:
        return list(points)
    known = [p for p in points if p[1] is not None]
    if len(known) <= 2 * buckets + 2:
        return known
    start, end = known[0][0], known[-1][0]
    span = end - start
    kept: list[Point] = [known[0]]
    bucket_of = (lambda t: min(buckets - 1, int((t - start) / span * buckets))) if span > 0 else (lambda t: 0)
    current = -1
    low = high = None
    for p in known[1:-1]:
        b = bucket_of(p[0])
        if b != current:
            kept.extend(_ordered(low, high))
            current, low, high = b, p, p
            continue
        if p[1] < low[1]:
            low = p
        if p[1] > high[1]:
            high = p
    kept.extend(_ordered(low, high))
    kept.append(known[-1])
    return kept


def _ordered(low: Point | None, high: Point | None) -> list[Point]:
    if low is None:
        return []
    if low is high:
        return [low]
    return [low, high] if low[0] <= high[0] else [high, low]
