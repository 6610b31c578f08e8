"""Growth of the live tensors over the run, as evidence for the judgement: how much of it is still
held at the end (the retention rule), or how it was let go of after the loop. Pure.

`allocated_growth` owns the rule that turns the allocated floor's growth (growth.floor_growth) into
the growth the judgement's row 2 weighs: retained when the live tensors at the end are above the
first floor by MIN_LEAK_BYTES and by half the growth (judgement.py's threshold), or, for a program
that freed its model before it ended, when what the exit search found piled up reaches that bar;
else released, when it rose to the loop's last step and was let go of only after it (`released`).
"""
from __future__ import annotations

from ..growth import GrowthFit, steady_rise
from ..recording.recording import AgentRecording
from ..recording.records import DeviceReading
from .findings import Breakdown, Growth
from .evidence import readings
from .judgement import MIN_LEAK_BYTES
from .words import rate_words

RELEASED_SHARE = 0.5  # of the growth, gone after the last step, for a growth to count as released
FALL_SHARE = 0.1  # of the growth: the floor falling back by more (and by 4 MiB) is a sawtooth


def allocated_growth(agent: AgentRecording, torch_index: int, nvml_index: int | None, b: Breakdown,
                     end: DeviceReading, fit: GrowthFit | None, series: list, by: str,
                     held: list[dict]) -> tuple[dict | None, Growth | None]:
    """(the growth the judgement weighs, its Growth for the report), or (None, None) where the
    allocated floor did not grow or nothing of the growth was held to the loop's end."""
    if fit is None:
        return None, None
    live_end = b.live_tensor_bytes if b.live_tensor_bytes is not None else end.allocated_bytes
    retained = live_end - fit.start_floor_bytes
    retained_by = "live-above-first-floor"
    # A program that frees its model and optimizer before it ends (a training loop in main()
    # that returns) ends below the first floor although the growth is all still held: then
    # what the exit search found piled up (alike tensors, one holder pattern) is the measure.
    # Seen on the H100: 214 MiB in __main__.kept[*] at exit, 275 MiB live, first floor 328 MiB.
    needed = max(MIN_LEAK_BYTES, fit.grown_bytes // 2)
    if retained < needed:
        piled = min(sum(x["bytes"] for x in held), live_end)
        if piled >= needed:
            retained, retained_by = piled, "accumulation-at-exit"
    let_go = None
    if retained < needed:
        # Growth through the whole loop that was let go of only after it (the function that
        # held it returned, a cycle was collected): the loop's leak all the same.
        let_go = released(agent, torch_index, fit, series)
    if retained < needed and let_go is None:
        return None, None
    g = growth_of(agent, torch_index, nvml_index, "allocated", by, fit, series)
    return {"series": "allocated", "by": by, "grown_bytes": fit.grown_bytes,
            "start_floor_bytes": fit.start_floor_bytes, "end_floor_bytes": fit.end_floor_bytes,
            "live_at_end_bytes": live_end, "retained_bytes": max(0, retained) if let_go is None else 0,
            "retained_by": retained_by if let_go is None else "released", "released": let_go,
            "rate_bytes_per_step": g.rate_bytes_per_step, "rate_bytes_per_s": g.rate_bytes_per_s,
            "points": fit.points, "rate_text": rate_words(g)}, g


def released(agent: AgentRecording, torch_index: int, fit: GrowthFit, series: list) -> dict | None:
    """How a growth that went on to the loop's last step was let go of after it: when (the first
    reading after the last step sample that is below the top floor by RELEASED_SHARE of the
    growth) and how: `gc-at-exit` (only gc.collect() at exit freed it: reference cycles held it),
    `gc-during-run` (an automatic collection freed it), or `after-the-loop` (what held it went
    away: a function returned, the program dropped it). None when it was not let go of."""
    if fit.grown_bytes < MIN_LEAK_BYTES or not series:
        return None
    last_step, last = series[-1][0], series[-1][1]
    low = fit.end_floor_bytes - RELEASED_SHARE * fit.grown_bytes
    # Held to the loop's end, and never let go of before: memory that rose and fell back during
    # the loop (a buffer reset every epoch) is a sawtooth, whatever happened after it.
    if last.allocated_bytes is None or last.allocated_bytes < fit.end_floor_bytes - (1 << 20):
        return None
    if not steady_rise([r.allocated_bytes for _, r in series], max(4 << 20, FALL_SHARE * fit.grown_bytes)):
        return None

    def collected(t0: float, t1: float) -> bool:  # an automatic collection freed half the growth here
        return any(t0 <= c["t"] <= t1 and sum(n for i, n in c["freed"] if i == torch_index)
                   >= RELEASED_SHARE * fit.grown_bytes for c in agent.root["collections"])
    # One that did so while it rose: the collector's sawtooth, seen at its peaks
    # (tests/fixtures/caught/garbage_cycles_neutral.json). Row 6 judges it.
    if collected(series[0][0].t, last_step.t):
        return None
    after = [(s, r) for s, r in readings(agent.samples, torch_index)
                 if s.t > last_step.t and r.allocated_bytes is not None]
    after += [(probes_s, probes_s.reading(torch_index)) for probes_s in
                 (agent.probes.get(p) for p in ("end", "gc")) if probes_s is not None]
    found = next(((s, r) for s, r in after if r is not None and r.allocated_bytes is not None
                  and r.allocated_bytes <= low), None)
    if found is None:
        return None
    s, r = found
    freed = (last.allocated_bytes or fit.end_floor_bytes) - r.allocated_bytes
    how = "gc-at-exit" if s.by == "gc" else "gc-during-run" if collected(last_step.t, s.t) else "after-the-loop"
    return {"how": how, "t": s.t, "after_t": last_step.t, "after_step": last_step.step,
            "freed_bytes": max(0, freed)}


def growth_of(agent: AgentRecording, torch_index: int, nvml_index: int | None, name: str, by: str,
            fit: GrowthFit, series) -> Growth:
    per_s = fit.rate_bytes_per_x if by == "time" else None
    start_step = None
    start_t = fit.start_x if by == "time" else None
    if by == "step":
        start_step = int(fit.start_x)
        steps = [(s.step, s.t) for s, _ in series]
        span_t = steps[-1][1] - steps[0][1]
        span_steps = steps[-1][0] - steps[0][0]
        if span_t > 0 and span_steps > 0:
            per_s = fit.rate_bytes_per_x * span_steps / span_t
        start_t = next((t for step, t in steps if step >= start_step), None)
    return Growth(pid=agent.pid, device=nvml_index, series=name, by=by, grown_bytes=fit.grown_bytes,
                  rate_bytes_per_step=fit.rate_bytes_per_x if by == "step" else None,
                  rate_bytes_per_s=per_s, start_step=start_step, start_t=start_t)
