"""How long a growth had left before its GPU was full: for the findings of memory that kept growing.

The free memory is the whole GPU's (NVML's: its total less what every process on it used), as the
supervisor read it (`Recording.device_memory`) at the end of the run: the last reading at or before
the process's last sample, while what had grown was still held; under a per-process memory fraction
(limits.py), no more than what the fraction allows less what PyTorch had reserved then. The rate is the growth's per
second; a growth measured per step has one only where the run's seconds per step were measured
(`retention.growth_of`), and where there is none nothing is said. A leak its structure decided (its
slope did not) has the rise of PyTorch's allocated counter while it rose (held.rise_rate). Pure.
"""
from __future__ import annotations

from . import claims, limits, words
from ..growth import seconds_to_full
from .findings import Diagnosis, Finding, Growth
from ..recording.recording import Recording

# The growth series that each finding of growth rests on (diagnose.py appends it to Diagnosis.growth).
SERIES = {"leak": ("allocated",), "non-torch": ("non_torch", "nvml")}


def add_time_to_full(recording: Recording, result: Diagnosis) -> None:
    """Give each finding of growth with a rate per second, on a GPU whose free memory was read,
    `time_to_full_s`, `free_bytes`, `free_t` and `rate_bytes_per_s` in its evidence."""
    for f in result.findings:
        growth = _growth_of(f, result.growth)
        rate = growth.rate_bytes_per_s if growth is not None else None
        if rate is None and f.kind == "leak" and f.evidence.get("decided_by") == "structure":
            rate = f.evidence.get("rise_rate_bytes_per_s")  # decided by its structure: the rise while it rose
        if rate is None:
            continue
        free = free_at(recording, f.device, _last_read_t(recording, f.pid, f.device))
        if free is None:
            continue
        t, free_bytes = free
        limit, source = _limit(recording, f)
        if source == limits.FRACTION and limit is not None:
            free_bytes = min(free_bytes, max(0, limit - _reserved_at_last(recording, f)))
        seconds = seconds_to_full(rate, free_bytes)
        if seconds is None:
            continue
        f.evidence.update({"rate_bytes_per_s": rate, "free_bytes": free_bytes,
                           "free_t": t, "time_to_full_s": round(seconds, 3), "limit_bytes": limit,
                           "limit_source": source})
        said = claims.make("time-to-full", rate_bytes_per_s=rate, free_bytes=free_bytes,
                           limit_bytes=limit, limit_source=source)
        if said is not None:
            f.claims.append(words.as_json(said))


def _torch_index(recording: Recording, f: Finding) -> tuple:
    agent = recording.agent(f.pid)
    if agent is None:
        return None, None
    device = next((d for d in agent.devices if d.nvml_index == f.device), None)
    return agent, device.index if device is not None else None


def _limit(recording: Recording, f: Finding) -> tuple[int | None, str | None]:
    """The limit in force on the finding's process on its GPU (limits.in_force)."""
    agent, index = _torch_index(recording, f)
    total = next((d.get("total_bytes") for d in recording.devices if d.get("index") == f.device), None)
    if agent is None or index is None:
        return total, limits.DEVICE if total else None
    return limits.in_force(agent, index, total)


def _reserved_at_last(recording: Recording, f: Finding) -> int:
    agent, index = _torch_index(recording, f)
    if agent is None or index is None or not agent.samples:
        return 0
    r = agent.samples[-1].reading(index)
    return (r.reserved_bytes or 0) if r is not None else 0


def _growth_of(f: Finding, growth: list[Growth]) -> Growth | None:
    """The growth a finding was decided by, or None (a leak decided by what was held at exit)."""
    if f.kind not in SERIES or f.pid is None or f.device is None:
        return None
    if f.kind == "leak" and f.evidence.get("decided_by") != "growth":
        return None
    return next((g for g in growth if g.pid == f.pid and g.device == f.device
                 and g.series in SERIES[f.kind]), None)


def _last_read_t(recording: Recording, pid: int, device: int) -> float | None:
    """When the process's memory was last read during the run: its agent's last sample, or else
    NVML's last reading of it on that GPU that found memory held."""
    agent = recording.agent(pid)
    if agent is not None and agent.samples:
        return agent.samples[-1].t
    held = [t for t, used in recording.nvml.get((pid, device), []) if used]
    return held[-1] if held else None


def free_at(recording: Recording, device: int, t: float | None) -> tuple[float, int] | None:
    """(when, free bytes) of the GPU's last reading at or before `t` that says its free memory;
    None when there is none (a recording of a version before these readings, NVML not answering)."""
    if t is None:
        return None
    read = [(when, free) for when, _, free in recording.device_memory.get(device, [])
            if when <= t and free is not None]
    return read[-1] if read else None
