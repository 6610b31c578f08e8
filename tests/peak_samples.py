"""Peak compositions made up for tests of drawing (figures invented here, never recorded)."""
from __future__ import annotations

from gpumemdoctor.diagnosis.findings import PEAK_CATEGORIES, PeakComposition, PeakPart

MiB, GiB = 1 << 20, 1 << 30


def composition(pid: int = 4242, device: int | None = 0, t: float | None = 2.0, **sizes: int) -> PeakComposition:
    """A composition whose parts are `sizes` (category with '_' for '-'), every category present, in
    PEAK_CATEGORIES' order; total the parts' sum."""
    given = {k.replace("_", "-"): v for k, v in sizes.items()}
    unknown = set(given) - set(PEAK_CATEGORIES)
    assert not unknown, unknown
    parts = [PeakPart(cat, given.get(cat, 0), f"how {cat} was told",
                      [{"name": f"holder of {cat}", "bytes": given.get(cat, 0), "line": f"train.py:{10 + i}"}]
                      if given.get(cat) and cat not in ("context", "cache", "fragmentation") else [])
             for i, cat in enumerate(PEAK_CATEGORIES)]
    total = sum(given.values())
    allocated = sum(p.bytes for p in parts if p.category in PEAK_CATEGORIES[:PEAK_CATEGORIES.index("unclassified") + 1])
    reserved = allocated + given.get("fragmentation", 0) + given.get("cache", 0)
    return PeakComposition(pid=pid, device=device, torch_index=device, t=t, step=7, total_bytes=total,
                           allocated_bytes=allocated, reserved_bytes=reserved, parts=parts)


def training_peak(pid: int = 4242, t: float | None = 2.0) -> PeakComposition:
    """A training step's peak: Adam's state twice the parameters, activations unclassified."""
    c = composition(pid=pid, t=t, parameters=512 * MiB, gradients=512 * MiB, optimizer_state=GiB,
                    unclassified=768 * MiB, cache=256 * MiB, outside_pytorch=64 * MiB, context=520 * MiB)
    c.allocated_peak_bytes = c.allocated_bytes + 192 * MiB
    c.notes = ["the holders of 768 MiB were not searched at this moment: read from the exit search"]
    c.where = "train.py:88 in step()"
    return c
