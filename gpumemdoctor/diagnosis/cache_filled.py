"""What filled the allocator's cache, where the cache is the larger part of a peak (issue 40, item 4).
Pure: it reads the process's samples up to the peak's moment.

Between two samples, PyTorch's reserved memory grows for one of two reasons: its allocated memory
went higher than ever (the allocated peak counter rose: the new memory was needed), or it asked for a
size that nothing it held could serve (the counter did not rise as much: the rest was reserved
beside memory it already had free). The second, summed over the samples up to the peak, is what
sizes that vary (sequence lengths, batch sizes), a tensor that grows, or blocks split apart cost.
Where that is not most of the cache, and the allocated peak counter had reached most of the reserved
memory, one moment filled it and let it go (a phase that freed a lot: an evaluation, a warm-up).
"""
from __future__ import annotations

from .findings import PeakComposition
from ..contract import PEAK_MIN_BYTES as MIN_CACHE_BYTES
from .summaries import tell

UNSERVED_SHARE = 0.5  # of the cache: reserved beside free memory, for sizes it could not serve
FILLED_SHARE = 0.8  # of the reserved memory: the allocated peak counter filled it


def unserved(agent, torch_index: int, until: float) -> tuple[int, int]:
    """Bytes PyTorch reserved beyond the rise of its allocated peak counter between consecutive
    samples up to `until`, and in how many of those intervals."""
    total = intervals = 0
    prev = None
    for s in getattr(agent, "samples", ()):
        if s.t > until:
            break
        r = s.reading(torch_index)
        if r is None or r.reserved_bytes is None:
            continue
        if prev is not None:
            grown = r.reserved_bytes - prev.reserved_bytes
            if grown > 0:
                needed = max(0, (r.allocated_peak_bytes or 0) - (prev.allocated_peak_bytes or 0))
                if grown > needed:
                    total += grown - needed
                    intervals += 1
        prev = r
    return total, intervals


def note(agent, c: PeakComposition) -> str | None:
    """Said where the cache is at least MIN_CACHE_BYTES and more than the memory in use then."""
    cache = c.part("cache")
    if cache is None or cache.bytes < MIN_CACHE_BYTES or cache.bytes <= c.allocated_bytes:
        return None
    extra, intervals = unserved(agent, c.torch_index, c.t + 1e-6)
    if extra >= UNSERVED_SHARE * cache.bytes:
        return tell("cache-unserved", extra=extra, intervals=intervals)
    counter = c.allocated_peak_bytes
    if counter is not None and c.reserved_bytes and counter >= FILLED_SHARE * c.reserved_bytes:
        return tell("cache-filled-once", counter=counter, reserved=c.reserved_bytes)
    return None
