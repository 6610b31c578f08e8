"""From a recording to a verdict: the breakdown, the growth, the findings. Pure: no NVML, no torch.

The breakdown of each process on each device at the end of the run is breakdown.py's. Growth,
findings (the judgement's table, judgement.py), suspects and the peak's composition follow here.
"""
from __future__ import annotations

from . import (breakdown, child_processes, ends, judgement, job, libraries, machine_faults, non_torch, peak,
               phases, probed, ranks, streams, suspects)
from .headroom import add_time_to_full
from .findings import (FINDING_KINDS, INFORMATIVE, PEAK_CATEGORIES, SPECIFICITY, VERDICTS, WARNINGS, Breakdown,
                       Diagnosis, Finding, Growth, Job, PeakComposition, PeakPart, RankRow, choose_verdict)
from ..growth import MIN_POINTS, GrowthFit, floor_growth, steady_rise
from .non_torch import LIBRARY_ALLOWANCE_BYTES
from .remedies import FINDINGS
from ..recording.recording import AgentRecording, Dist, Recording, TorchSample
from ..recording.records import DeviceReading
from ..units import format_bytes as fb

# What a diagnosis is made of lives in findings.py; these names are this module's too, where the
# rest of the package and the tests look for them.
__all__ = ["FINDING_KINDS", "INFORMATIVE", "PEAK_CATEGORIES", "PeakComposition", "PeakPart", "SPECIFICITY", "VERDICTS", "WARNINGS", "Breakdown", "Diagnosis",
           "Finding", "Growth", "Job", "LIBRARY_ALLOWANCE_BYTES", "RankRow", "choose_verdict", "diagnose",
           "diagnose_job", "peaks"]

MIB = 1 << 20
SIGNIFICANT_BYTES = 64 * MIB  # retained memory below this is not worth a verdict
MIN_LEAK_BYTES = 16 * MIB  # growth below this over the run is not called a leak
MIN_STEPS = 8


def diagnose(recording: Recording) -> Diagnosis:
    """Turn a recording into findings and a verdict."""
    return diagnose_job([recording])


def diagnose_job(recordings: list[Recording]) -> Diagnosis:
    """Turn the recordings of one job (one per node, or per rank under srun) into one diagnosis:
    each recording's own findings, then one rank table, the findings across ranks and the job's
    verdict over them all. One recording is the plain `diagnose`."""
    parts = [_diagnose_recording(r) for r in recordings]
    result = parts[0] if len(parts) == 1 else job.merged(recordings, parts)
    job.finish_job(result, measured=any(r.nvml_available for r in recordings))
    return result


def _diagnose_recording(recording: Recording) -> Diagnosis:
    """One recording's findings, breakdowns and rank rows; no verdict yet."""
    result = Diagnosis(verdict=None, peaks=peaks(recording), notes=list(recording.notes))
    result.notes.extend(machine_faults.nvml_notes(recording))
    rank_of = ranks.rank_processes(recording)
    host = machine_faults.host_memory(recording)
    if host is not None:
        result.findings.append(Finding(kind=host.kind, bytes=host.bytes, pid=recording.target_pid,
                                       summary=host.summary, evidence=host.evidence, remedy=host.remedy))
    if not recording.nvml_available:
        result.notes.append("no NVIDIA GPU was measured: NVML was not available")
        job.rank_rows(recording, rank_of, result)
        job.stamp(recording, rank_of, result)
        return result
    ended = {a.pid: ends.how_ended(recording, a) for a in recording.agents if ends.used_cuda(a)}
    for agent in recording.agents:
        if ended.get(agent.pid) is not None:
            result.notes.append(ends.note(agent, ended[agent.pid]))
        for torch_index in _torch_devices(agent):
            _diagnose_torch_device(agent, torch_index, result, rank_of.get(agent.pid), ended.get(agent.pid))
    torch_pids = {b.pid for b in result.breakdowns}
    for (pid, device), points in sorted(recording.nvml.items()):
        if pid not in torch_pids and any(used for _, used in points):
            if ended.get(pid) is not None:  # its agent saw CUDA start, and it ended before a reading
                ends.unread(pid, device, points, ended[pid], result)
            else:
                _diagnose_nvml_only(pid, device, points, result)
    child_processes.orphans(recording, result)
    child_processes.child_contexts(recording, result, set(rank_of))
    job.add_stray_context_findings(recording, rank_of, result)
    unseen = [a.pid for a in recording.agents if a.cuda_t is not None
              and not any(pid == a.pid for pid, _ in recording.nvml)]
    if unseen:
        result.notes.append(
            f"NVML listed no memory for process {', '.join(map(str, unseen))} although it used CUDA: "
            "in a container, run with the host's PID namespace (docker --pid=host) so NVML's PIDs "
            "match; figures that need NVML are n/a")
    add_time_to_full(recording, result)
    if not recording.nvml and not result.breakdowns:
        result.notes.append("the target never held GPU memory")
    job.rank_rows(recording, rank_of, result)
    job.stamp(recording, rank_of, result)
    return result


# -- one process on one device, seen by the agent ----------------------------------

def _torch_devices(agent: AgentRecording) -> list[int]:
    seen: list[int] = []
    for sample in [*agent.samples, *agent.probes.values()]:
        for r in sample.readings:
            if r.torch_index not in seen:
                seen.append(r.torch_index)
    return sorted(seen)


def _readings(samples: list[TorchSample], torch_index: int) -> list[tuple[TorchSample, DeviceReading]]:
    out = []
    for s in samples:
        r = s.reading(torch_index)
        if r is not None:
            out.append((s, r))
    return out


def _diagnose_torch_device(agent: AgentRecording, torch_index: int, result: Diagnosis,
                           dist: Dist | None = None, ended: dict | None = None) -> None:
    device = agent.device(torch_index)
    nvml_index = device.nvml_index if device else None
    during = _readings(agent.samples, torch_index)
    probes = {phase: s.reading(torch_index) for phase, s in agent.probes.items()}
    end = probes.get("end") or (during[-1][1] if during else None)
    if end is None:
        return
    b, context, pooled, pending = breakdown.at_exit(agent, torch_index, nvml_index, during, probes, end)
    after_gc = probes.get("gc")
    result.breakdowns.append(b)
    where = _where(agent, torch_index, nvml_index, dist)
    settled = streams.note(where, pending)
    if settled:
        result.notes.append(settled)

    series, by = _steady_series(agent, torch_index)
    xs = [s.step if by == "step" else s.t for s, _ in series]
    allocated = floor_growth(xs, [r.allocated_bytes for _, r in series], MIN_LEAK_BYTES)
    outside_ys = [r.nvml_used_bytes - r.reserved_bytes - context
                  if context is not None and r.nvml_used_bytes and r.reserved_bytes is not None else None
                  for _, r in series]
    after_warmup = non_torch.judge(xs, outside_ys, by) if context is not None else None
    outside_fit = after_warmup.fit if after_warmup is not None else None
    non_torch.itemise(b, agent, torch_index, xs, outside_ys, after_warmup, [s.t for s, _ in series])
    libraries.itemise(b, agent, torch_index)

    growth = None
    # What the exit search found piled up: the judgement's rows 3 and 4, and below, what growth left.
    held, unheld = suspects.accumulations(suspects.search_of(agent.root, "exit"), torch_index)
    if allocated is not None:
        live_end = b.live_tensor_bytes if b.live_tensor_bytes is not None else end.allocated_bytes
        retained = live_end - allocated.start_floor_bytes
        retained_by = "live-above-first-floor"
        # A program that frees its model and optimizer before it ends (a training loop in main()
        # that returns) ends below the first floor although the growth is all still held: then
        # what the exit search found piled up (alike tensors, one holder pattern) is the measure.
        # Seen on the H100: 214 MiB in __main__.kept[*] at exit, 275 MiB live, first floor 328 MiB.
        needed = max(MIN_LEAK_BYTES, allocated.grown_bytes // 2)
        if retained < needed:
            piled = min(sum(x["bytes"] for x in held), live_end)
            if piled >= needed:
                retained, retained_by = piled, "accumulation-at-exit"
        released = None
        if retained < needed:
            # Growth through the whole loop that was let go of only after it (the function that
            # held it returned, a cycle was collected): the loop's leak all the same.
            released = _released(agent, torch_index, allocated, series)
        if retained >= needed or released is not None:
            g = _growth(agent, torch_index, nvml_index, "allocated", by, allocated, series)
            result.growth.append(g)
            growth = {"series": "allocated", "by": by, "grown_bytes": allocated.grown_bytes,
                      "start_floor_bytes": allocated.start_floor_bytes,
                      "end_floor_bytes": allocated.end_floor_bytes, "live_at_end_bytes": live_end,
                      "retained_bytes": max(0, retained) if released is None else 0,
                      "retained_by": retained_by if released is None else "released",
                      "released": released,
                      "rate_bytes_per_step": g.rate_bytes_per_step,
                      "rate_bytes_per_s": g.rate_bytes_per_s, "points": allocated.points,
                      "rate_text": _rate(g)}
    evidence = _evidence(agent, torch_index, nvml_index, where, b, series, by, growth, held, unheld)
    _exit_state(evidence, b, probes, end, context, agent.cuda_t)
    evidence.pending = streams.evidence(pending)
    evidence.ended, evidence.collector = ended, (agent.exit_info or {}).get("collector")
    if ended is not None:
        evidence.last_allocated_bytes, evidence.last_t = end.allocated_bytes, during[-1][0].t if during else None
    result.evidence.append({**evidence.to_json(),
                            "non_torch": after_warmup.to_json() if after_warmup is not None else None})
    for j in judgement.judge(evidence):
        if j.kind == "leak" and j.evidence["decided_by"] == "growth":
            released = bool(j.evidence.get("released"))
            j.suspects, j.evidence["root_cause"] = suspects.leak_suspects(agent.root, torch_index, released)
            named = probed.growth_suspects(j.evidence["root_cause"], agent, torch_index, released)
            j.suspects, j.evidence["root_cause"] = named or (j.suspects, j.evidence["root_cause"])
            j.summary += f" No search named its holder ({j.evidence['root_cause']['why_not']})." if named else ""
            held = j.suspects and j.suspects[0]["holders"]
            j.remedy = j.suspects[0]["remedy"] if held else FINDINGS["leak-unsearched"]
        elif j.kind == "live-at-exit":
            j.suspects, j.evidence["root_cause"] = suspects.live_suspects(agent.root, torch_index)
            j.remedy = j.suspects[0]["remedy"] if j.suspects else FINDINGS["live-at-exit-unsearched"]
        elif j.kind == "garbage-cycle":
            j.suspects, j.evidence["garbage"] = suspects.garbage_suspects(agent.root)
            j.evidence.update({"allocated_at_end": end.allocated_bytes,
                               "allocated_after_gc_collect": after_gc.allocated_bytes if after_gc else None,
                               "objects_collected": agent.probes["gc"].collected if "gc" in agent.probes
                               else None})
        result.findings.append(Finding(kind=j.kind, bytes=j.bytes, pid=agent.pid, device=nvml_index,
                                       summary=j.summary, evidence=j.evidence, remedy=j.remedy,
                                       suspects=j.suspects))

    outside_growth = (_growth(agent, torch_index, nvml_index, "non_torch", by, outside_fit, series)
                      if outside_fit is not None else None)
    peak = non_torch.run_peak(xs, outside_ys, after_warmup)
    decided = judgement.outside_pytorch(
        _rate(outside_growth) if outside_growth is not None else None,
        non_torch.beyond_allowance(b, libraries.pooled_bytes(b)), peak,
        LIBRARY_ALLOWANCE_BYTES + libraries.pooled_bytes(b) + (b.non_torch_nccl_bytes or 0))
    if decided is not None:
        how, words = decided
        if how == "growth":
            result.growth.append(outside_growth)
            size = max(outside_fit.grown_bytes, (b.non_torch_bytes or 0) - outside_fit.start_floor_bytes)
        else:
            size = b.non_torch_bytes if how == "exit" else peak["rise"]
        result.findings.append(non_torch.finding(agent, torch_index, nvml_index, where, size, b, words,
                                                 after_warmup))
        result.findings[-1].evidence.update({"decided_by": how, **({"peak": peak} if how == "peak" else {})})
    elif non_torch.too_short(xs, outside_ys, after_warmup):
        result.notes.append(non_torch.too_short_note(where, by, xs, after_warmup, b.non_torch_bytes))
    for f in result.findings[-1:]:
        if f.kind == "non-torch" and f.pid == agent.pid:
            libraries.name_holders(f, agent)
    result.findings.extend(libraries.pool_findings(agent, torch_index, nvml_index, where, pooled))
    _peak(agent, torch_index, b, where, result)


def _peak(agent: AgentRecording, torch_index: int, b: Breakdown, where: str, result: Diagnosis) -> None:
    """What made the process's peak on this device, and the peaks that could be lower (peak.py).
    An evaluation's graphs already found by the pause's search (row 13) are one finding, not two."""
    composition, found = peak.compose(agent, torch_index, b, where)
    if composition is None:
        return
    result.peak_compositions.append(composition)
    for f in found:
        same = next((x for x in result.findings if x.kind == f.kind and x.pid == f.pid and x.device == f.device), None)
        if same is not None and f.kind == "avoidable-peak":
            same.evidence["graphs_kept_at_peak"] = {"bytes": f.bytes, "holder": f.evidence.get("holder"),
                                                    "line": f.evidence.get("line")}
            continue
        result.findings.append(f)


def _exit_state(e: judgement.Evidence, b: Breakdown, probes: dict, end: DeviceReading, context: int | None,
                cuda_t: float | None) -> None:
    """What the exit probes read, for the judgement's rows on the context, the stream and the cache."""
    after_sync, after_empty = probes.get("sync"), probes.get("empty_cache")
    e.context_bytes, e.cuda_t = context, cuda_t
    e.pending_stream_bytes, e.cache_bytes = b.pending_stream_bytes, b.cache_bytes
    e.active_bytes, e.allocated_bytes, e.reserved_bytes = end.active_bytes, end.allocated_bytes, end.reserved_bytes
    if after_sync and after_sync.active_bytes is not None and after_sync.allocated_bytes is not None:
        e.pending_after_sync_bytes = after_sync.active_bytes - after_sync.allocated_bytes
    if after_empty is not None:
        e.after_empty_cache = (after_empty.reserved_bytes, after_empty.nvml_used_bytes)


MIN_WATCHED_AFTER = 4  # samples at (nearly) the final level before growth over time may decide
RELEASED_SHARE = 0.5  # of the growth, gone after the last step, for a growth to count as released
FALL_SHARE = 0.1  # of the growth: the floor falling back by more (and by 4 MiB) is a sawtooth


def _released(agent: AgentRecording, torch_index: int, fit: GrowthFit, series: list) -> dict | None:
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
    readings = [(s, r) for s, r in _readings(agent.samples, torch_index)
                if s.t > last_step.t and r.allocated_bytes is not None]
    readings += [(probes_s, probes_s.reading(torch_index)) for probes_s in
                 (agent.probes.get(p) for p in ("end", "gc")) if probes_s is not None]
    found = next(((s, r) for s, r in readings if r is not None and r.allocated_bytes is not None
                  and r.allocated_bytes <= low), None)
    if found is None:
        return None
    s, r = found
    freed = (last.allocated_bytes or fit.end_floor_bytes) - r.allocated_bytes
    how = "gc-at-exit" if s.by == "gc" else "gc-during-run" if collected(last_step.t, s.t) else "after-the-loop"
    return {"how": how, "t": s.t, "after_t": last_step.t, "after_step": last_step.step,
            "freed_bytes": max(0, freed)}


def _evidence(agent: AgentRecording, torch_index: int, nvml_index: int | None, where: str, b: Breakdown,
              series: list, by: str, growth: dict | None, held: list[dict],
              unheld: list[dict]) -> judgement.Evidence:
    """What was observed of one process on one GPU, for the judgement."""
    values = [r.allocated_bytes for _, r in series if r.allocated_bytes is not None]
    samples = len(values)
    # Samples can miss the build-up: a loop that runs between two samples, or right before exit.
    seen_most = max(values, default=0)
    unseen = max(0, (b.live_tensor_bytes or 0) - seen_most) if b.exit_probes else 0
    # Or see it only at the very end: an inference loop of 0.1 s at the end of a run, caught by
    # the last of eleven samples (H100). Growth over time decides only when the samples went on
    # for a while after they first saw what is alive at exit.
    near = max(SIGNIFICANT_BYTES, (b.live_tensor_bytes or 0) // 4)
    reached = next((i for i, v in enumerate(values) if v >= seen_most - near), samples)
    watched_after = samples - reached
    oom_search = suspects.search_of(agent.root, "oom")
    oom_held, _ = suspects.accumulations(oom_search, torch_index)
    oom_suspects, oom_meta = suspects.live_suspects(agent.root, torch_index, when="oom")
    _, exit_meta = suspects.live_suspects(agent.root, torch_index)
    info = agent.exit_info or {}
    collections = info.get("collections")
    if collections is not None:
        freeing = [c for c in agent.root["collections"] if any(i == torch_index for i, _ in c["freed"])]
        collections = dict(collections, records=len(freeing),
                           first_t=freeing[0]["t"] if freeing else None,
                           biggest_at=_biggest_collection(freeing, torch_index))
    in_order = [(s.by, s.t, s.step, r.allocated_bytes, r.allocated_peak_bytes)
                for s, r in _readings(agent.samples, torch_index)]
    pauses = phases.pauses(in_order, b.live_tensor_bytes if b.exit_probes else None)
    phase_held, phase_meta = suspects.phase_accumulations(agent.root, torch_index, held)
    if not phase_meta["searched"] and pauses:  # no copy searched its height (the pause limit): the probe
        found, meta = probed.phase_holders(agent, torch_index, max(p.rise for p in pauses))
        if meta is not None:
            phase_held, phase_meta["probed"] = found, meta
    return judgement.Evidence(
        pid=agent.pid, device=nvml_index, torch_index=torch_index, where=where, samples=samples, by=by,
        pauses=pauses,
        phase_accumulations=phase_held, phase_search=phase_meta,
        enough_samples=samples >= MIN_POINTS and unseen < near and watched_after >= MIN_WATCHED_AFTER,
        unseen_bytes=unseen, watched_after=watched_after, growth=growth,
        live_bytes=b.live_tensor_bytes if b.exit_probes else None, garbage_bytes=b.garbage_bytes,
        accumulations=held, unheld=unheld, exit_search=exit_meta, collections=collections,
        ooms=[o for o in agent.root["ooms"] if o["device"] == torch_index],
        oom_accumulations=oom_held, oom_suspects=oom_suspects, oom_search=oom_meta,
        uncaught=info.get("uncaught"), exited_normally=agent.exited_normally)


def _biggest_collection(freeing: list[dict], torch_index: int) -> dict | None:
    if not freeing:
        return None
    c = max(freeing, key=lambda c: sum(b for i, b in c["freed"] if i == torch_index))
    line = suspects.user_line(c["stack"])
    return {"t": c["t"], "step": c["step"], "generation": c["generation"], "thread": c["thread"],
            "freed_bytes": sum(b for i, b in c["freed"] if i == torch_index),
            "at": suspects.at(line) if line else None}


def _steady_series(agent: AgentRecording, torch_index: int):
    """Step-aligned samples when the program marks steps, otherwise samples over time."""
    by_step = [(s, r) for s, r in _readings(agent.samples, torch_index) if s.by == "step" and s.step is not None]
    if len(by_step) >= MIN_STEPS and by_step[-1][0].step - by_step[0][0].step >= MIN_STEPS:
        return by_step, "step"
    return _readings(agent.samples, torch_index), "time"


def _growth(agent: AgentRecording, torch_index: int, nvml_index: int | None, name: str, by: str,
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


def _rate(g: Growth) -> str:
    parts = []
    if g.rate_bytes_per_step is not None:
        parts.append(f"{fb(int(g.rate_bytes_per_step))} per step")
    if g.rate_bytes_per_s is not None:
        parts.append(f"{fb(int(g.rate_bytes_per_s))} per second")
    start = f"from step {g.start_step}" if g.start_step is not None else (
        f"from {g.start_t:.1f} s" if g.start_t is not None else "")
    return " (".join([" and ".join(parts) or "steadily", start + ")"]) if start else " and ".join(parts)


def _where(agent: AgentRecording, torch_index: int, nvml_index: int | None, dist: Dist | None = None) -> str:
    """'process 123 on GPU 0', or for a rank 'process 123 (rank 1, local rank 1) on GPU 1'."""
    gpu = f"GPU {nvml_index}" if nvml_index is not None else f"cuda:{torch_index}"
    return f"{ranks.who(agent.pid, dist)} on {gpu}"


# -- processes seen only through NVML (no agent, or no torch) -----------------------

def _diagnose_nvml_only(pid: int, device: int, points: list[tuple[float, int | None]],
                        result: Diagnosis) -> None:
    held = [(t, used) for t, used in points if used]
    if not held:
        return
    first, last = held[0][1], held[-1][1]
    result.breakdowns.append(Breakdown(pid=pid, device=device, torch_index=None, nvml_bytes=last,
                                       context_bytes=first, non_torch_bytes=max(0, last - first)))
    fit = floor_growth([t for t, _ in held], [u for _, u in held], MIN_LEAK_BYTES)
    grown = last - first
    if fit is not None or grown > LIBRARY_ALLOWANCE_BYTES:
        size = fit.grown_bytes if fit is not None else grown
        if fit is not None:
            result.growth.append(Growth(pid=pid, device=device, series="nvml", by="time",
                                        grown_bytes=fit.grown_bytes, rate_bytes_per_step=None,
                                        rate_bytes_per_s=fit.rate_bytes_per_x, start_step=None,
                                        start_t=fit.start_x))
        result.findings.append(Finding(
            kind="non-torch", bytes=size, pid=pid, device=device,
            summary=f"Process {pid} on GPU {device} grew from {fb(first)} when first seen to {fb(last)}, "
                    f"outside PyTorch (no PyTorch allocator was seen in it).",
            evidence={"first_seen_bytes": first, "last_seen_bytes": last,
                      "first_seen_t": held[0][0], "last_seen_t": held[-1][0]},
            remedy=FINDINGS["non-torch-unseen"]))


# -- peaks --------------------------------------------------------------------------

def peaks(rec: Recording) -> dict:
    """Highest NVML total of the process tree, and the allocator's own peak counters."""
    events = sorted((t, key, used) for key, points in rec.nvml.items() for t, used in points
                    if used is not None)
    current: dict = {}
    nvml_peak = 0
    nvml_peak_t = None
    for t, key, used in events:
        current[key] = used
        total = sum(current.values())
        if total > nvml_peak:
            nvml_peak, nvml_peak_t = total, t
    allocated_peak = reserved_peak = None
    for agent in rec.agents:
        for torch_index in _torch_devices(agent):
            readings = [r for _, r in _readings([*agent.samples, *agent.probes.values()], torch_index)]
            for r in readings:
                if r.allocated_peak_bytes is not None:
                    allocated_peak = max(allocated_peak or 0, r.allocated_peak_bytes)
                if r.reserved_peak_bytes is not None:
                    reserved_peak = max(reserved_peak or 0, r.reserved_peak_bytes)
    return {"nvml_bytes": nvml_peak if rec.nvml_available else None, "nvml_t": nvml_peak_t,
            "allocated_bytes": allocated_peak, "reserved_bytes": reserved_peak}
