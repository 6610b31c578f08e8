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
    """The floor's sustained rise over x, or None when the series does not keep growing."""
    points = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if len(points) < MIN_POINTS:
        return None
    points = points[max(1, int(len(points) * WARMUP_FRACTION)):]
    size = len(points) // WINDOWS
    if size < 1:
        return None
    windows = [points[i * size:(i + 1) * size] for i in range(WINDOWS - 1)]
    windows.append(points[(WINDOWS - 1) * size:])
    floors = [min(window, key=lambda p: p[1]) for window in windows]
    rises = [b[1] - a[1] for a, b in zip(floors, floors[1:])]
    if any(rise < -tolerance_bytes for rise in rises):
        return None  # a floor fell back: sawtooth or a cleared cache
    if rises[-1] <= tolerance_bytes or sum(r > tolerance_bytes for r in rises) < len(rises) - 1:
        return None  # growth stopped: warm-up, or a cache that filled once
    grown = floors[-1][1] - floors[0][1]
    if grown < min_growth_bytes:
        return None
    return GrowthFit(grown_bytes=int(grown), rate_bytes_per_x=_slope(floors),
                     start_x=floors[0][0], start_floor_bytes=int(floors[0][1]),
                     end_floor_bytes=int(floors[-1][1]), points=len(points))


def _slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope through the floors."""
    n = len(points)
    mean_x = sum(p[0] for p in points) / n
    mean_y = sum(p[1] for p in points) / n
    var = sum((p[0] - mean_x) ** 2 for p in points)
    if var == 0:
        return 0.0
    return sum((p[0] - mean_x) * (p[1] - mean_y) for p in points) / var
