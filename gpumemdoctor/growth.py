"""Telling a real leak from warm-up, a filling cache and a sawtooth: pure arithmetic on a series.

A series is a floor that should stay flat once warm-up is over. We drop the
first tenth of the points (warm-up), cut the rest into consecutive windows and
take each window's minimum (its floor), which ignores transient activations
and sawtooth peaks. Memory *kept growing* when the floors rise through the run,
the last rise included, by more than a minimum amount. Growth that stops early
(warm-up), and floors that fall back (a sawtooth, a cache that is cleared), are
not growth.

`lasting_growth` is the stricter rule for memory outside PyTorch, which grows by
itself while kernels and libraries load: it judges only what comes after a
warm-up, and says when too little came after it to tell.
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_POINTS = 8
WINDOWS = 4
WARMUP_FRACTION = 0.1
FALL_WINDOW = 4  # samples per stretch when looking for the floor falling back (steady_rise)
RISE_SHARE = 0.75  # of the steps from one stretch to the next, from the first rise, that rise
RISE_MIN_BYTES = 1 << 20


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


def steady_rise(values: list, drop: float) -> bool:
    """Whether the floor rose stretch after stretch and never fell back by more than `drop`: the
    lowest of each stretch of FALL_WINDOW samples (or of a sixteenth of them: what a step's own
    activations and gradients do not move) rises in at least RISE_SHARE of the steps from one
    stretch to the next, counted from the first rise. A loop that piles up does; a sawtooth, or
    a series that is flat and jumps once, does not."""
    values = [v for v in values if v is not None]
    size = max(FALL_WINDOW, len(values) // 16)
    floors = [min(values[i:i + size]) for i in range(0, len(values), size)]
    steps = [b - a for a, b in zip(floors, floors[1:])]
    if any(d < -drop for d in steps):
        return False
    first = next((i for i, d in enumerate(steps) if d > RISE_MIN_BYTES), None)
    if first is None:
        return False
    steps = steps[first:]
    return sum(1 for d in steps if d > RISE_MIN_BYTES) >= RISE_SHARE * len(steps)


# -- growth that lasts past warm-up (memory outside PyTorch) ----------------------------

WARMUP_SHARE = 0.25  # warm-up lasts at least this share of the series' span
LASTING_WINDOWS = 3


@dataclass(frozen=True)
class AfterWarmup:
    """What `lasting_growth` judged: the part of a series after warm-up, and its growth."""

    warmup_end_x: float  # where warm-up ended
    points: int  # points after warm-up
    span_x: float  # from the end of warm-up to the last point
    enough: bool  # enough points over a long enough span to judge
    fit: GrowthFit | None  # the growth that lasted past warm-up, or None

    def to_json(self) -> dict:
        return {"warmup_end": self.warmup_end_x, "points_after_warmup": self.points,
                "span_after_warmup": self.span_x, "enough_after_warmup": self.enough,
                "growing": self.fit is not None}


def lasting_growth(xs: list[float], ys: list[int | None], warmup_x: float, min_span_x: float,
                   min_growth_bytes: int, tolerance_bytes: int = 1 << 20) -> AfterWarmup | None:
    """The rise of a series' floor after warm-up, judged only where the growth lasts past it.

    Memory outside PyTorch's allocator grows by itself in a program's first moments: kernels
    load on first use (CUDA's lazy module loading) and libraries set up their state, and a
    loop over new shapes keeps loading kernels for a while. So:

    1. Warm-up is not judged: the points before x0 + max(warmup_x, WARMUP_SHARE of the span),
       x0 being the first point.
    2. Enough: at least MIN_POINTS points after warm-up, reaching at least `min_span_x` past
       its end. Otherwise the growth cannot be told from warm-up (`enough` False, no fit).
    3. Lasting: the span after warm-up is cut into three consecutive windows of equal length
       (of equal count when one of them has no point), each window's lowest point its floor:
       samples come further apart as their cost or the run's length grows (the sampler's pacing),
       and windows of equal count would then put most of a run's time into the last one. The
       series kept growing when the floor rose from the first window to the second and from the
       second to the last, each by more than `tolerance_bytes`, and by at least `min_growth_bytes`
       in all: a rise that stops (the last of the kernels loading) or that comes once late in the
       run (an evaluation's new kernels) is not growth, and neither is a floor that falls back.

    None for a series without points. Runs in the diagnosis only (never inside the program).
    """
    points = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if not points:
        return None
    first, last = points[0][0], points[-1][0]
    end = first + max(warmup_x, WARMUP_SHARE * (last - first))
    after = [(x, y) for x, y in points if x >= end]
    span = last - end if after else 0.0
    enough = len(after) >= MIN_POINTS and span >= min_span_x
    fit = None
    if enough:
        windows = _windows(after, end, span)
        floors = [min(window, key=lambda p: p[1]) for window in windows]
        rises = [b[1] - a[1] for a, b in zip(floors, floors[1:])]
        grown = floors[-1][1] - floors[0][1]
        if all(rise > tolerance_bytes for rise in rises) and grown >= min_growth_bytes:
            fit = GrowthFit(grown_bytes=int(grown), rate_bytes_per_x=_slope(floors), start_x=floors[0][0],
                            start_floor_bytes=int(floors[0][1]), end_floor_bytes=int(floors[-1][1]),
                            points=len(after))
    return AfterWarmup(warmup_end_x=end, points=len(after), span_x=span, enough=enough, fit=fit)


def _windows(after: list[tuple[float, int]], start: float, span: float) -> list[list]:
    """The points after warm-up in LASTING_WINDOWS windows of equal length, or of equal count."""
    if span > 0:
        windows: list[list] = [[] for _ in range(LASTING_WINDOWS)]
        for x, y in after:
            windows[min(LASTING_WINDOWS - 1, int((x - start) / span * LASTING_WINDOWS))].append((x, y))
        if all(windows):
            return windows
    size = len(after) // LASTING_WINDOWS
    windows = [after[i * size:(i + 1) * size] for i in range(LASTING_WINDOWS - 1)]
    windows.append(after[(LASTING_WINDOWS - 1) * size:])
    return windows


# -- time to out-of-memory --------------------------------------------------------------

# Below this much free memory a GPU counts as full: PyTorch's allocator asks CUDA for segments of
# at least 2 MiB, so less than that fits nothing new.
FULL_BYTES = 2 << 20


def seconds_to_full(rate_bytes_per_s: float | None, free_bytes: int | None) -> float | None:
    """Seconds until memory growing at `rate_bytes_per_s` fills the `free_bytes` left on the GPU
    (NVML's free: its total less what every process on it uses); 0.0 when it is already full. None
    when the rate is not a growth (zero, negative, unknown) or the free memory is unknown."""
    if rate_bytes_per_s is None or free_bytes is None or not rate_bytes_per_s > 0 or free_bytes < 0:
        return None
    if free_bytes < FULL_BYTES:
        return 0.0
    return free_bytes / rate_bytes_per_s
