"""Telling a real leak from warm-up, a filling cache and a sawtooth: pure arithmetic on a series.

A series is a floor that should stay flat once warm-up is over. We drop the
first tenth of the points (warm-up), cut the rest into consecutive windows and
take each window's minimum (its floor), which ignores transient activations
and sawtooth peaks. Memory *kept growing* when the floors rise through the run,
the last rise included, by more than a minimum amount. Growth that stops early
(warm-up), and floors that fall back (a sawtooth, a cache that is cleared), are
not growth.
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_POINTS = 8
WINDOWS = 4
WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class GrowthFit:
    grown_bytes: int  # rise of the floor from the first window to the last
    rate_bytes_per_x: float  # per step, or per second when x is time
    start_x: float  # where the first floor lies: growth was under way from here
    start_floor_bytes: int
    end_floor_bytes: int
    points: int


def floor_growth(xs: list[float], ys: list[int | None], min_growth_bytes: int,
                 tolerance_bytes: int = 1 << 20) -> GrowthFit | None:
    """The floor's sustained rise over x, or None when the series does not keep growing.

    The agent runs this inside the measured program, so the answer "no growth" makes no
    container (no list, tuple or dict): those would come from free lists that the program
    shares, and move its garbage collector (see _agent/neutral.py). Indexes only.
    """
    count = 0
    for i in range(len(ys)):
        if ys[i] is not None:
            count += 1
    if count < MIN_POINTS:
        return None
    skip = int(count * WARMUP_FRACTION)
    if skip < 1:
        skip = 1
    size = (count - skip) // WINDOWS
    if size < 1:
        return None
    # One pass over the points after warm-up: each window's lowest point (its floor), and how
    # the floors rise from one window to the next.
    seen = window = in_window = 0
    floor_x = floor_y = first_x = first_y = prev_y = last_rise = 0
    rising = 0
    for i in range(len(ys)):
        y = ys[i]
        if y is None:
            continue
        seen += 1
        if seen <= skip:
            continue
        if in_window == 0 or y < floor_y:
            floor_x, floor_y = xs[i], y
        in_window += 1
        if in_window == size and window < WINDOWS - 1 or seen == count:
            if window == 0:
                first_x, first_y = floor_x, floor_y
            else:
                last_rise = floor_y - prev_y
                if last_rise < -tolerance_bytes:
                    return None  # a floor fell back: sawtooth or a cleared cache
                if last_rise > tolerance_bytes:
                    rising += 1
            prev_y = floor_y
            window += 1
            in_window = 0
    if last_rise <= tolerance_bytes or rising < WINDOWS - 2:
        return None  # growth stopped: warm-up, or a cache that filled once
    grown = prev_y - first_y
    if grown < min_growth_bytes:
        return None
    return GrowthFit(grown_bytes=int(grown), rate_bytes_per_x=_slope(_floors(xs, ys, skip, size)),
                     start_x=first_x, start_floor_bytes=int(first_y),
                     end_floor_bytes=int(prev_y), points=count - skip)


def _floors(xs: list[float], ys: list[int | None], skip: int, size: int) -> list[tuple[float, int]]:
    """Each window's lowest point, as floor_growth cuts them (once growth is found)."""
    points = [(x, y) for x, y in zip(xs, ys) if y is not None][skip:]
    windows = [points[i * size:(i + 1) * size] for i in range(WINDOWS - 1)]
    windows.append(points[(WINDOWS - 1) * size:])
    return [min(window, key=lambda p: p[1]) for window in windows]


def _slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope through the floors."""
    n = len(points)
    mean_x = sum(p[0] for p in points) / n
    mean_y = sum(p[1] for p in points) / n
    var = sum((p[0] - mean_x) ** 2 for p in points)
    if var == 0:
        return 0.0
    return sum((p[0] - mean_x) * (p[1] - mean_y) for p in points) / var
