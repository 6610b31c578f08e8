"""The ranks of a distributed job in a diagnosis: the rank table of a recording, the host on what it
names, several recordings' diagnoses side by side, and the step across ranks (each rank's verdict,
`rank-imbalance`, the job, the verdict). Pure; `ranks.py` holds the rules, `diagnose.py` calls this."""
from __future__ import annotations

from . import ranks
from .summaries import tell
from .findings import INFORMATIVE, Diagnosis, Finding, Job, RankRow, choose_verdict
from ..recording.recording import Dist, Recording

MAX_WORLD = 1 << 16  # a world size beyond this is not believed: missing ranks are not listed


def add_stray_context_findings(rec: Recording, rank_of: dict[int, Dist], result: Diagnosis) -> None:
    """A context on a GPU the process does not work on (ranks.stray_contexts); the processes of a
    child-contexts finding are that finding's already."""
    skip = {(p["pid"], f.device) for f in result.findings if f.kind == "child-contexts"
            for p in f.evidence["processes"]}
    for pid, device, j in ranks.stray_contexts(rec, rank_of, skip):
        result.findings.append(Finding(kind=j.kind, bytes=j.bytes, pid=pid, device=device, summary=j.summary,
                                       evidence=j.evidence, remedy=j.remedy))


def rank_rows(rec: Recording, rank_of: dict[int, Dist], result: Diagnosis) -> None:
    """One row per rank and GPU it used (one row without a GPU for a rank that held none)."""
    for pid, dist in sorted(rank_of.items(), key=lambda kv: (kv[1].rank is None, kv[1].rank or 0, kv[0])):
        agent = rec.agent(pid)
        for torch_index, nvml_index in ranks.gpus(rec, agent) or [(None, None)]:
            reserved, allocated, nvml_used = (ranks.peaks_on(rec, agent, torch_index, nvml_index)
                                              if (torch_index, nvml_index) != (None, None) else (None, None, None))
            breakdown = next((i for i, b in enumerate(result.breakdowns) if b.pid == pid and b.device == nvml_index
                              and (torch_index is None or b.torch_index == torch_index)), None)
            result.ranks.append(RankRow(
                host=rec.host, rank=dist.rank, local_rank=dist.local_rank, node_rank=dist.node_rank,
                world_size=dist.world_size, pid=pid, device=nvml_index, torch_index=torch_index,
                breakdown=breakdown, peak_reserved_bytes=reserved, peak_allocated_bytes=allocated,
                peak_nvml_bytes=nvml_used))


def stamp(rec: Recording, rank_of: dict[int, Dist], result: Diagnosis) -> None:
    """The host on everything that names a PID (PIDs repeat across hosts), and the rank on the
    evidence of every finding about a rank."""
    for item in [*result.findings, *result.breakdowns, *result.growth, *result.peak_compositions]:
        item.host = rec.host
    for e in result.evidence:
        e["host"] = rec.host
    for f in result.findings:
        dist = rank_of.get(f.pid)
        if dist is not None:
            f.evidence.setdefault("rank", dist.rank)
            f.evidence.setdefault("local_rank", dist.local_rank)


def merged(recordings: list[Recording], parts: list[Diagnosis]) -> Diagnosis:
    """Several recordings' diagnoses as one: everything side by side, each note prefixed with its
    host, the peaks the highest of them."""
    result = Diagnosis(verdict=None)
    for rec, part in zip(recordings, parts):
        offset = len(result.breakdowns)
        result.findings.extend(part.findings)
        result.breakdowns.extend(part.breakdowns)
        result.peak_compositions.extend(part.peak_compositions)
        result.growth.extend(part.growth)
        result.evidence.extend(part.evidence)
        for row in part.ranks:
            if row.breakdown is not None:
                row.breakdown += offset
            result.ranks.append(row)
        result.notes.extend(tell("job-run-note", host=rec.host, pid=rec.target_pid, note=note) for note in part.notes)
    result.ranks.sort(key=lambda r: (r.rank is None, r.rank or 0, r.host or "", r.pid, r.device or 0))
    result.peaks = _highest_peaks(recordings, parts)
    run_ids = sorted({a.dist.run_id for r in recordings for a in r.agents if a.dist and a.dist.run_id})
    if len(run_ids) > 1:
        result.notes.append(tell("job-run-ids", run_ids=run_ids))
    return result


def _highest_peaks(recordings: list[Recording], parts: list[Diagnosis]) -> dict:
    """Across hosts, each peak is the highest of the hosts' (their clocks are not compared, so
    what they held at one moment together is not known), with the host of the NVML peak."""
    out: dict = {"nvml_bytes": None, "nvml_t": None, "allocated_bytes": None, "reserved_bytes": None,
                 "nvml_host": None}
    for rec, part in zip(recordings, parts):
        p = part.peaks
        if p.get("nvml_bytes") is not None and (out["nvml_bytes"] is None or p["nvml_bytes"] > out["nvml_bytes"]):
            out.update(nvml_bytes=p["nvml_bytes"], nvml_t=p.get("nvml_t"), nvml_host=rec.host)
        for key in ("allocated_bytes", "reserved_bytes"):
            if p.get(key) is not None:
                out[key] = max(out[key] or 0, p[key])
    return out


def finish_job(result: Diagnosis, measured: bool) -> None:
    """Across the ranks: each rank's verdict, the imbalance between them, the job; the verdict."""
    for row in result.ranks:
        mine = [f for f in result.findings if f.pid == row.pid and f.host == row.host]
        row.verdict = choose_verdict(mine) if measured else None
    per_rank: dict = {}
    for row in result.ranks:
        best = per_rank.get(row.rank)
        if row.rank is not None and (best is None or (row.peak_reserved_bytes or -1) > (best["peak_reserved_bytes"] or -1)):
            per_rank[row.rank] = {"rank": row.rank, "local_rank": row.local_rank, "pid": row.pid, "host": row.host,
                                  "device": row.device, "peak_reserved_bytes": row.peak_reserved_bytes}
    found = ranks.imbalance(list(per_rank.values()))
    if found is not None:
        top, j = found
        result.findings.append(Finding(kind=j.kind, bytes=j.bytes, pid=top["pid"], device=top["device"],
                                       host=top["host"], summary=j.summary, evidence=j.evidence, remedy=j.remedy))
    result.findings.sort(key=lambda f: (f.kind in INFORMATIVE, f.kind == "context", -f.bytes))
    result.verdict = choose_verdict(result.findings) if measured else None
    result.job = _job(result) if result.ranks else None


def _job(result: Diagnosis) -> Job:
    seen = sorted({r.rank for r in result.ranks if r.rank is not None})
    world = max((r.world_size for r in result.ranks if r.world_size is not None), default=None)
    hosts = sorted({r.host for r in result.ranks}, key=lambda h: (h is None, h or ""))
    missing = [n for n in range(world) if n not in seen] if world is not None and world <= MAX_WORLD else []
    leaking = {(f.host, f.pid) for f in result.findings if f.kind == "leak"}
    with_leak = sorted({r.rank for r in result.ranks if r.rank is not None and (r.host, r.pid) in leaking})
    count = len({(r.host, r.pid) for r in result.ranks})
    return Job(ranks=seen, world_size=world, hosts=hosts, missing_ranks=missing, ranks_with_leak=with_leak,
               verdict=result.verdict, summary=ranks.job_summary(count, hosts, world, missing, with_leak))
