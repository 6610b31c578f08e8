"""From a recording to a verdict: the breakdown, the growth, the findings. Pure: no NVML, no torch.

This module only calls the parts in order, for each process on each device: the breakdown at exit
(breakdown.py), the growth of the live tensors (retention.py), the evidence (evidence.py), the
judgement's finished findings with their suspects (judgement.py, holders.py), memory outside
PyTorch (non_torch.py), other libraries' pools, and what made the peak (peak.py); then the job's
parts across processes and ranks.
"""
from __future__ import annotations

from . import (breakdown, child_processes, ends, evidence, holders, judgement, job, libraries, limits,
               machine_faults, non_torch, peak, ranks, retention, step_gaps, streams, suspects, words)
from .accumulations import accumulations
from .evidence import readings
from .words import rate_words
from .headroom import add_time_to_full
from .findings import (FINDING_KINDS, INFORMATIVE, PEAK_CATEGORIES, SPECIFICITY, VERDICTS, WARNINGS, Breakdown,
                       Diagnosis, Finding, Growth, Job, PeakComposition, PeakPart, RankRow, choose_verdict)
from ..growth import floor_growth
from .judgement import MIN_LEAK_BYTES
from .non_torch import LIBRARY_ALLOWANCE_BYTES
from .remedies import FINDINGS
from .summaries import tell
from ..recording.recording import AgentRecording, Dist, Recording

# What a diagnosis is made of lives in findings.py; these names are this module's too, where the
# rest of the package and the tests look for them.
__all__ = ["FINDING_KINDS", "INFORMATIVE", "PEAK_CATEGORIES", "PeakComposition", "PeakPart", "SPECIFICITY", "VERDICTS", "WARNINGS", "Breakdown", "Diagnosis",
           "Finding", "Growth", "Job", "LIBRARY_ALLOWANCE_BYTES", "RankRow", "choose_verdict", "diagnose",
           "diagnose_job", "peaks"]

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
        result.notes.append(tell("nvml-unavailable"))
        job.rank_rows(recording, rank_of, result)
        job.stamp(recording, rank_of, result)
        return result
    ended = {a.pid: ends.how_ended(recording, a) for a in recording.agents if ends.used_cuda(a)}
    for agent in recording.agents:
        if ended.get(agent.pid) is not None:
            result.notes.append(ends.note(agent, ended[agent.pid]))
        if (gap := step_gaps.note(agent)) is not None:
            result.notes.append(gap)
        for torch_index in _torch_devices(agent):
            _diagnose_torch_device(agent, torch_index, result, rank_of.get(agent.pid), ended.get(agent.pid),
                                   _total_of(recording, agent, torch_index))
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
        result.notes.append(tell("nvml-listed-none", pids=unseen))
    add_time_to_full(recording, result)
    if not recording.nvml and not result.breakdowns:
        result.notes.append(tell("never-held"))
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


def _total_of(recording: Recording, agent: AgentRecording, torch_index: int) -> int | None:
    """The NVML total of the GPU a torch index is (a MIG slice's own), or None where not read."""
    device = agent.device(torch_index)
    index = device.nvml_index if device else None
    return next((d.get("total_bytes") for d in recording.devices if d.get("index") == index), None)


def _diagnose_torch_device(agent: AgentRecording, torch_index: int, result: Diagnosis,
                           dist: Dist | None = None, ended: dict | None = None, total: int | None = None) -> None:
    """One process on one GPU, in order: the breakdown at exit, the evidence (growth of the live
    tensors, what the searches found, what the exit probes read), the judgement's findings with their
    suspects, memory outside PyTorch, other libraries' pools, and what made the peak."""
    device = agent.device(torch_index)
    nvml_index = device.nvml_index if device else None
    during = readings(agent.samples, torch_index)
    probes = {phase: s.reading(torch_index) for phase, s in agent.probes.items()}
    end = probes.get("end") or (during[-1][1] if during else None)
    if end is None:
        return
    b, context, pooled, pending = breakdown.at_exit(agent, torch_index, nvml_index, during, probes, end)
    result.breakdowns.append(b)
    where = _where(agent, torch_index, nvml_index, dist)
    result.notes.extend(n for n in [streams.note(where, pending)] if n)

    series, by = _steady_series(agent, torch_index)
    xs = [s.step if by == "step" else s.t for s, _ in series]
    outside_ys = [r.nvml_used_bytes - r.reserved_bytes - context
                  if context is not None and r.nvml_used_bytes and r.reserved_bytes is not None else None
                  for _, r in series]
    after_warmup = non_torch.judge(xs, outside_ys, by) if context is not None else None
    non_torch.itemise(b, agent, torch_index, xs, outside_ys, after_warmup, [s.t for s, _ in series])
    libraries.itemise(b, agent, torch_index)

    # What the exit search found piled up: the judgement's rows 3 and 4, and what growth left.
    held, unheld = accumulations(suspects.search_of(agent.root, "exit"), torch_index)
    fit = floor_growth(xs, [r.allocated_bytes for _, r in series], MIN_LEAK_BYTES)
    growth, g = retention.allocated_growth(agent, torch_index, nvml_index, b, end, fit, series, by, held)
    result.growth.extend([g] if g is not None else [])
    e = evidence.gather(agent, torch_index, nvml_index, where, b, series, by, growth, held, unheld)
    evidence.exit_state(e, b, probes, end, context, agent.cuda_t)
    e.pending, e.holders = streams.evidence(pending), holders.Holders(agent, torch_index)
    e.ended, e.collector = ended, (agent.exit_info or {}).get("collector")
    e.limit_bytes, e.limit_source = limits.in_force(agent, torch_index, total)
    if ended is not None:
        e.last_allocated_bytes, e.last_t = end.allocated_bytes, during[-1][0].t if during else None
    result.evidence.append({**e.to_json(), "non_torch": after_warmup.to_json() if after_warmup is not None else None})
    result.findings.extend(Finding(kind=j.kind, bytes=j.bytes, pid=agent.pid, device=nvml_index, summary=j.summary,
                                   evidence=j.evidence, remedy=j.remedy, suspects=j.suspects,
                                   claims=[words.as_json(c) for c in j.claims])
                           for j in judgement.judge(e))
    _outside_pytorch(agent, torch_index, nvml_index, where, b, xs, outside_ys, after_warmup, series, by, result)
    result.findings.extend(libraries.pool_findings(agent, torch_index, nvml_index, where, pooled))
    _peak(agent, torch_index, b, where, result)


def _outside_pytorch(agent: AgentRecording, torch_index: int, nvml_index: int | None, where: str, b: Breakdown,
                     xs: list, outside_ys: list, after_warmup, series: list, by: str, result: Diagnosis) -> None:
    """Memory outside PyTorch: the judgement's rows 11, 17 and 18 (`judgement.outside_pytorch`)."""
    outside_fit = after_warmup.fit if after_warmup is not None else None
    outside_growth = (retention.growth_of(agent, torch_index, nvml_index, "non_torch", by, outside_fit, series)
                      if outside_fit is not None else None)
    peak = non_torch.run_peak(xs, outside_ys, after_warmup)
    decided = judgement.outside_pytorch(
        rate_words(outside_growth) if outside_growth is not None else None,
        non_torch.beyond_allowance(b, libraries.pooled_bytes(b)), peak,
        LIBRARY_ALLOWANCE_BYTES + libraries.pooled_bytes(b) + (b.non_torch_nccl_bytes or 0))
    if decided is None:
        if non_torch.too_short(xs, outside_ys, after_warmup):
            result.notes.append(non_torch.too_short_note(where, by, xs, after_warmup, b.non_torch_bytes))
        return
    how, words = decided
    if how == "growth":
        result.growth.append(outside_growth)
        size = max(outside_fit.grown_bytes, (b.non_torch_bytes or 0) - outside_fit.start_floor_bytes)
    else:
        size = b.non_torch_bytes if how == "exit" else peak["rise"]
    found = non_torch.finding(agent, torch_index, nvml_index, where, size, b, words, after_warmup,
                              {"decided_by": how, **({"peak": peak} if how == "peak" else {})})
    libraries.name_holders(found, agent)
    result.findings.append(found)


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


def _steady_series(agent: AgentRecording, torch_index: int):
    """Step-aligned samples when the program marks steps, otherwise samples over time."""
    by_step = [(s, r) for s, r in readings(agent.samples, torch_index) if s.by == "step" and s.step is not None]
    if len(by_step) >= MIN_STEPS and by_step[-1][0].step - by_step[0][0].step >= MIN_STEPS:
        return by_step, "step"
    return readings(agent.samples, torch_index), "time"


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
            summary=tell("nvml-only-grew", pid=pid, device=device, first_bytes=first, last_bytes=last),
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
            seen = [r for _, r in readings([*agent.samples, *agent.probes.values()], torch_index)]
            for r in seen:
                if r.allocated_peak_bytes is not None:
                    allocated_peak = max(allocated_peak or 0, r.allocated_peak_bytes)
                if r.reserved_peak_bytes is not None:
                    reserved_peak = max(reserved_peak or 0, r.reserved_peak_bytes)
    return {"nvml_bytes": nvml_peak if rec.nvml_available else None, "nvml_t": nvml_peak_t,
            "allocated_bytes": allocated_peak, "reserved_bytes": reserved_peak}
