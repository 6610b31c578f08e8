"""The JSON report: a diagnosis with the recording it rests on, written and read back strictly."""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from ..recording import records
from ..diagnosis.diagnose import FINDING_KINDS, VERDICTS, Breakdown, Diagnosis, Finding, Growth, Job, RankRow
from ..errors import BadReportError
from ..files.inputs import read_json
from ..files.outputs import write_text
from ..recording.recording import Recording
from ..files.strict import (check_sizes, need_dict, need_int, need_list, need_num, need_pairs, need_size, need_str,
                     opt_int, opt_num, opt_size, opt_str)

SCHEMA = "gpumemdoctor.report/1"
MAX_REPORT_BYTES = 512 << 20


def build(recording: Recording, diagnosis: Diagnosis) -> dict:
    """The report as a JSON-ready dict (schema gpumemdoctor.report/1)."""
    target = recording.target
    return {
        "schema": SCHEMA,
        "verdict": diagnosis.verdict,
        "findings": [f.to_json() for f in diagnosis.findings],
        "breakdown": [b.to_json() for b in diagnosis.breakdowns],
        "growth": [g.to_json() for g in diagnosis.growth],
        "peaks": diagnosis.peaks,
        "notes": diagnosis.notes,
        "evidence": diagnosis.evidence,
        "ranks": [r.to_json() for r in diagnosis.ranks],
        "job": None if diagnosis.job is None else diagnosis.job.to_json(),
        "target": {"argv": target.get("argv"), "pid": target.get("pid"),
                   "exit_code": target.get("exit_code"), "signal": target.get("signal"),
                   "duration_s": recording.duration_s},
        "devices": recording.devices,
        "versions": recording.versions,
        "timeline": timeline(recording),
        "recording": recording.to_json(),
    }


def timeline(recording: Recording) -> list[dict]:
    """Every agent sample of every process, flattened: one row per process, device and moment."""
    rows = []
    for agent in recording.agents:
        for sample in agent.samples:
            for r in sample.readings:
                device = agent.device(r.torch_index)
                rows.append({"pid": agent.pid, "device": device.nvml_index if device else None,
                             "t": sample.t, "step": sample.step, "by": sample.by,
                             "nvml_bytes": r.nvml_used_bytes, "reserved_bytes": r.reserved_bytes,
                             "active_bytes": r.active_bytes, "allocated_bytes": r.allocated_bytes})
    return rows


# The supervisor's own environment, when a launcher started gpumemdoctor itself: the node's rank,
# and the task's rank when it runs one gpumemdoctor per rank (srun --ntasks-per-node N).
NODE_VARIABLES = ("GROUP_RANK", "SLURM_NODEID")
TASK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def default_name(stem: str, recording: Recording, env: Mapping[str, str]) -> str:
    """The report's name when -o is not given: gpumemdoctor-<stem>.<pid>.json on one machine; under
    a launcher (gpumemdoctor started by srun, mpirun or torchrun, or a job whose ranks span several
    nodes) also the host and what is known of the node and task, so that each node's report gets a
    name of its own in a shared folder: gpumemdoctor-<stem>.<host>.node<N>.rank<R>.<pid>.json."""
    node = next((_whole(env[v]) for v in NODE_VARIABLES if env.get(v) is not None), None)
    task = next((_whole(env[v]) for v in TASK_VARIABLES if env.get(v) is not None), None)
    dists = [a.dist for a in recording.agents if a.dist is not None]
    spans_nodes = any(d.world_size is not None and d.local_world_size is not None
                      and d.world_size > d.local_world_size for d in dists)
    if node is None:
        nodes = {d.node_rank for d in dists if d.node_rank is not None}
        node = nodes.pop() if len(nodes) == 1 else None
    launched = any(env.get(v) is not None for v in (*NODE_VARIABLES, *TASK_VARIABLES))
    if not (launched or spans_nodes):
        return f"gpumemdoctor-{stem}.{recording.target_pid}.json"
    parts = [f"gpumemdoctor-{stem}"]
    host = re.sub(r"[^A-Za-z0-9_-]", "_", (recording.host or "").split(".")[0])
    if host:
        parts.append(host)
    if node is not None:
        parts.append(f"node{node}")
    if task is not None:
        parts.append(f"rank{task}")
    return ".".join([*parts, str(recording.target_pid), "json"])


def _whole(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def write(report: dict, path: str, force: bool) -> None:
    """Write the report (as outputs.write_text writes every file); refuse to replace a file unless forced."""
    write_text(json.dumps(report, indent=1) + "\n", path, force)


def load(path: str) -> tuple[Recording, Diagnosis]:
    """Read a saved report strictly; BadReportError names what is wrong."""
    obj = read_json(path, MAX_REPORT_BYTES, "report")
    try:
        return parse(obj)
    except BadReportError as exc:
        raise BadReportError(f"{path} is not a valid report: {exc}") from None


def parse(obj: Any) -> tuple[Recording, Diagnosis]:
    obj = need_dict(obj, "report")
    check_sizes(obj, "report")  # every `bytes` and `..._bytes`, also in evidence and root-cause records
    if obj.get("schema") != SCHEMA:
        raise BadReportError(f"schema {obj.get('schema')!r}, expected {SCHEMA!r}")
    verdict = obj.get("verdict")
    if verdict is not None and verdict not in VERDICTS:
        raise BadReportError(f"unknown verdict {verdict!r}")
    findings = []
    for f in need_list(obj.get("findings"), "findings"):
        f = need_dict(f, "finding")
        if f.get("kind") not in FINDING_KINDS:
            raise BadReportError(f"unknown finding kind {f.get('kind')!r}")
        findings.append(Finding(kind=f["kind"], bytes=need_size(f.get("bytes"), "finding bytes"),
                                summary=need_str(f.get("summary"), "summary"),
                                evidence=_finding_evidence(f.get("evidence")),
                                remedy=need_str(f.get("remedy"), "remedy"),
                                pid=opt_int(f.get("pid"), "pid"), device=opt_int(f.get("device"), "device"),
                                suspects=records.parse_suspects(f.get("suspects")),
                                host=opt_str(f.get("host"), "finding host")))
    breakdowns = []
    for b in need_list(obj.get("breakdown"), "breakdown"):
        b = need_dict(b, "breakdown")
        # The parts after non_torch_bytes are absent from reports made before they were measured.
        sizes = {k: opt_size(b.get(k), k) for k in (
            "nvml_bytes", "context_bytes", "live_tensor_bytes", "garbage_bytes",
            "pending_stream_bytes", "cache_bytes", "non_torch_bytes", "cublas_workspace_bytes",
            "private_pool_bytes", "non_torch_warmup_bytes", "non_torch_cupy_bytes", "non_torch_rest_bytes")}
        nccl = b.get("nccl")
        if nccl is not None and not isinstance(nccl, bool):
            raise BadReportError(f"breakdown nccl: expected true, false or null, found {nccl!r:.40}")
        breakdowns.append(Breakdown(pid=need_int(b.get("pid"), "pid"), device=opt_int(b.get("device"), "device"),
                                    torch_index=opt_int(b.get("torch_index"), "torch_index"),
                                    exit_probes=bool(b.get("exit_probes")),
                                    host=opt_str(b.get("host"), "breakdown host"), nccl=nccl,
                                    cuda_module_loading=opt_str(b.get("cuda_module_loading"),
                                                                "breakdown cuda_module_loading"),
                                    non_torch_libraries=_pools(b.get("non_torch_libraries")), **sizes))
    growth = []
    for g in need_list(obj.get("growth", []), "growth"):
        g = need_dict(g, "growth")
        growth.append(Growth(pid=need_int(g.get("pid"), "pid"), device=opt_int(g.get("device"), "device"),
                             series=need_str(g.get("series"), "series"), by=need_str(g.get("by"), "by"),
                             grown_bytes=need_size(g.get("grown_bytes"), "grown_bytes"),
                             rate_bytes_per_step=opt_num(g.get("rate_bytes_per_step"), "rate"),
                             rate_bytes_per_s=opt_num(g.get("rate_bytes_per_s"), "rate"),
                             start_step=opt_int(g.get("start_step"), "start_step"),
                             start_t=opt_num(g.get("start_t"), "start_t"),
                             host=opt_str(g.get("host"), "growth host")))
    peaks = need_dict(obj.get("peaks"), "peaks")
    for key in ("nvml_bytes", "allocated_bytes", "reserved_bytes"):
        opt_size(peaks.get(key), f"peak {key}")
    if peaks.get("nvml_t") is not None:
        need_num(peaks["nvml_t"], "peak time")
    opt_str(peaks.get("nvml_host"), "peak host")
    notes = [need_str(n, "note") for n in need_list(obj.get("notes", []), "notes")]
    evidence = [_evidence(e) for e in need_list(obj.get("evidence", []), "evidence")]
    rows = [_rank_row(r, len(breakdowns)) for r in need_list(obj.get("ranks", []), "ranks")]
    job = None if obj.get("job") is None else _job(obj["job"])
    recording = Recording.from_json(obj.get("recording"))
    return recording, Diagnosis(verdict=verdict, findings=findings, breakdowns=breakdowns,
                                growth=growth, peaks=peaks, notes=notes, evidence=evidence, ranks=rows,
                                job=job)


def _pools(value: Any) -> list | None:
    """A breakdown's other libraries' pools, [[library, bytes]]; absent before they were measured."""
    if value is None:
        return None
    out = []
    for item in need_list(value, "non_torch_libraries"):
        item = need_list(item, "non_torch_libraries")
        if len(item) != 2:
            raise BadReportError("non_torch_libraries: expected [library, bytes]")
        out.append([need_str(item[0], "non_torch_libraries"), opt_size(item[1], "non_torch_libraries")])
    return out


def _verdict_or_none(value: Any, what: str) -> str | None:
    if value is not None and value not in VERDICTS:
        raise BadReportError(f"unknown {what} {value!r:.40}")
    return value


def _rank_row(r: Any, breakdowns: int) -> RankRow:
    """One rank and GPU (reports without ranks have none: they load as before)."""
    r = need_dict(r, "rank row")
    numbers = {key: opt_int(r.get(key), f"rank row {key}") for key in (
        "rank", "local_rank", "node_rank", "world_size", "device", "torch_index", "breakdown",
        "peak_reserved_bytes", "peak_allocated_bytes", "peak_nvml_bytes")}
    row = RankRow(host=opt_str(r.get("host"), "rank host"), pid=need_int(r.get("pid"), "rank pid"),
                  verdict=_verdict_or_none(r.get("verdict"), "rank verdict"), **numbers)
    if row.breakdown is not None and not 0 <= row.breakdown < breakdowns:
        raise BadReportError(f"rank breakdown {row.breakdown} is not one of the {breakdowns} breakdowns")
    return row


def _job(j: Any) -> Job:
    j = need_dict(j, "job")
    return Job(ranks=[need_int(n, "job rank") for n in need_list(j.get("ranks"), "job ranks")],
               world_size=opt_int(j.get("world_size"), "job world_size"),
               hosts=[opt_str(h, "job host") for h in need_list(j.get("hosts"), "job hosts")],
               missing_ranks=[need_int(n, "missing rank") for n in need_list(j.get("missing_ranks"), "missing_ranks")],
               ranks_with_leak=[need_int(n, "rank with leak")
                                for n in need_list(j.get("ranks_with_leak"), "ranks_with_leak")],
               verdict=_verdict_or_none(j.get("verdict"), "job verdict"),
               summary=need_str(j.get("summary"), "job summary"))


def _finding_evidence(e: Any) -> dict:
    """A finding's evidence is data; the fields that the reporters draw are checked."""
    e = need_dict(e, "evidence")
    opt_str(e.get("decided_by"), "evidence decided_by")
    need_pairs(e.get("curve") or [], "evidence curve [t, bytes]", need_num, need_size)
    root = e.get("root_cause")
    if root is not None:
        root = need_dict(root, "evidence root_cause")
        if "elapsed_s" in root:
            need_num(root["elapsed_s"], "root_cause elapsed_s")
        opt_int(root.get("step"), "root_cause step")
        opt_str(root.get("when"), "root_cause when")
        opt_str(root.get("why_not"), "root_cause why_not")
    garbage = e.get("garbage")
    if garbage is not None:
        garbage = need_dict(garbage, "evidence garbage")
        opt_int(garbage.get("objects_freed"), "garbage objects_freed")
        need_pairs(garbage.get("types") or [], "garbage types [name, count]", need_str, need_int)
    return e


def _evidence(e: Any) -> dict:
    """One process and GPU's evidence: its identity and counts are checked; the rest is data."""
    e = need_dict(e, "evidence")
    need_int(e.get("pid"), "evidence pid")
    opt_int(e.get("device"), "evidence device")
    need_int(e.get("samples"), "evidence samples")
    for key in ("accumulations", "unheld", "out_of_memory"):
        for item in need_list(e.get(key, []), f"evidence {key}"):
            need_size(need_dict(item, f"evidence {key}").get("bytes", item.get("request_bytes")), f"{key} bytes")
    return e
