"""What a finding of memory held at the end says besides its size (judgement rows 2 and 3): that it was
read before the interpreter's shutdown let go of it, CUDA graphs' private pools counted with their
graphs, and an accumulation that is a leak by its structure, whatever the samples' slope. Pure."""
from __future__ import annotations

from . import claims
from .claims import Claim
from .evidence import SIGNIFICANT_BYTES, Evidence


def held_claims(e: Evidence, size: int, pools_counted: int = 0) -> tuple[list[Claim], int]:
    """What a finding of memory held at the end also says, and its size with it: that the exit probes
    read it before the interpreter's shutdown let go of it (its threads joined), and the CUDA graphs'
    private pools, whose free memory is the graphs' too (allocated memory counts only their outputs):
    added, unless the size already counts the pools (`pools_counted`: the bytes of their segments that
    the exit search found held by their graphs)."""
    out: list[Claim] = []
    s = e.shutdown or {}
    if s.get("before_shutdown") and s.get("threads_joined"):
        out.append(claims.make("held-until-shutdown", before_shutdown=True, threads_joined=s["threads_joined"]))
    if e.graph_pools:
        pools, reserved, allocated = e.graph_pools
        made = claims.make("graph-pools", pool_bytes=reserved, graphs=pools, pool_allocated_bytes=allocated)
        if made is not None:
            out.append(made)
            if not pools_counted:
                size += max(0, reserved - allocated)
    return [c for c in out if c is not None], size


STRUCTURE_STEP_SLACK = 0.1  # of the steps: an accumulation of about one tensor a step
# Of an accumulation's allocated bytes, come after the first third of the samples. A third, not a
# half: a run whose program works on for a while after its last allocation (40 CUDA graphs captured in
# 3.5 s, then 4 s of torch.cuda.memory_snapshot(), H200) has most of its growth inside the first third
# of its samples; a dataset loaded at the start has none of it after.
RISE_SHARE = 1 / 3


def allocated_part(e: Evidence, a: dict) -> int:
    """What of an accumulation PyTorch's allocated counter sees: its bytes, less the free part of the
    CUDA graphs' private pools it holds (reserved for the graphs' replays, allocated to no tensor; the
    share of the pools' segments that is free at exit, from the exit's pool figures)."""
    pools = a.get("graph_pool_bytes") or 0
    if not pools or not e.graph_pools or not e.graph_pools[1]:
        return a["bytes"]
    _, reserved, allocated = e.graph_pools
    return a["bytes"] - round(pools * max(0, reserved - allocated) / reserved)


def structural(e: Evidence) -> tuple[dict, Claim] | None:
    """An accumulation that is a leak by its structure, whatever the samples' slope: alike tensors held
    by one holder pattern, allocated at one line (with stacks), at least SIGNIFICANT_BYTES, and either
    one more at each step (as many as the steps, within STRUCTURE_STEP_SLACK) or, without steps, most of
    it made after the run's first third of samples (not a dataset loaded at the start). None where none
    is."""
    for a in e.accumulations:
        if a["bytes"] < SIGNIFICANT_BYTES or a.get("where") is None:
            continue
        one_a_step = (e.by == "step" and e.steps >= 8
                      and abs(a["count"] - e.steps) <= max(2, STRUCTURE_STEP_SLACK * e.steps))
        values = e.allocated_values
        third = len(values) // 3
        rose = (e.by == "time" and third >= 1
                and max(values[:third]) + RISE_SHARE * allocated_part(e, a) <= max(values[-third:]))
        if not (one_a_step or rose):
            continue
        made = claims.make("decided-by-structure", pattern=a["pattern"], count=a["count"], min_count=8,
                           same_line=True, one_a_step=one_a_step, rose_after_first_third=rose)
        if made is not None:
            return a, made
    return None


def rise_rate(e: Evidence, near_bytes: int) -> float | None:
    """How fast PyTorch's allocated counter rose while it rose, per second: from the first reading to the
    first that came within `near_bytes` of its highest. The rate of a leak that the structure decided
    (its slope alone did not), for the time it would take to fill what was left; None without two
    readings a moment apart."""
    values, times = e.allocated_values, e.allocated_times
    if len(values) < 2 or len(times) != len(values):
        return None
    top = max(values)
    reached = next(i for i, v in enumerate(values) if v >= top - near_bytes)
    span = times[reached] - times[0]
    if reached == 0 or span <= 0 or values[reached] <= values[0]:
        return None
    return (values[reached] - values[0]) / span
