"""The JSON report file: a diagnosis with the recording it rests on, written (`build`, `write`) and
read back strictly (`load`, `parse`: the declared shapes at the end). The reporters draw what it
holds; `run` writes it, `report` and `compare` read it."""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from ..diagnosis.findings import (FINDING_KINDS, PEAK_CATEGORIES, VERDICTS, Breakdown, Diagnosis, Finding, Growth,
                                  Job, PeakComposition, PeakPart, RankRow)
from ..errors import BadReportError
from ..files.inputs import read_json
from ..files.outputs import write_text
from ..files.schema import (ANY, BOOL, COUNT, DURATION, INT, NUM, PID, SECONDS, SIZE, STR, Shape, absent,
                            also, check_sizes, dict_of, list_of, may, need_dict, null_as, one_of, opt, pair)
from ..recording import records
from ..recording.recording import DEVICE, TARGET_FIELDS, VERSIONS, Recording

SCHEMA = "gpumemdoctor.report/1"
MAX_REPORT_BYTES = 512 << 20
# The supervisor's own environment, when a launcher started gpumemdoctor itself: the node's rank,
# and the task's rank when it runs one gpumemdoctor per rank (srun --ntasks-per-node N).
NODE_VARIABLES = ("GROUP_RANK", "SLURM_NODEID")
TASK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


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
        "peak_compositions": [p.to_json() for p in diagnosis.peak_compositions],
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
    """A report read strictly: the declared shapes below, then the recording it rests on."""
    obj = need_dict(obj, "report")
    check_sizes(obj, "report")  # every `bytes` and `..._bytes`, also in evidence and root-cause records
    if obj.get("schema") != SCHEMA:
        raise BadReportError(f"schema {obj.get('schema')!r}, expected {SCHEMA!r}")
    report = REPORT(obj, "report")
    for row in report["ranks"]:
        if row.breakdown is not None and not 0 <= row.breakdown < len(report["breakdowns"]):
            raise BadReportError(f"rank breakdown {row.breakdown} is not one of the "
                                 f"{len(report['breakdowns'])} breakdowns")
    recording = Recording.from_json(obj.get("recording"))
    return recording, Diagnosis(**{k: v for k, v in report.items() if k not in COPIES})


# -- the report's declared shapes -----------------------------------------------------------
# Fields that reports of earlier versions did not have are `absent(...)`, with what they meant.

VERDICT = opt(one_of(*VERDICTS))
# A finding's evidence is data; the fields that the reporters draw are checked, the rest kept.
ROOT_CAUSE = Shape({"searched": may(opt(BOOL)), "elapsed_s": may(DURATION), "step": may(opt(INT)),
                    "when": may(opt(STR)), "why_not": may(opt(STR)), "declined": may(opt(STR)),
                    "gave_up": may(opt(STR)),
                    "probed": may(opt(Shape({"t": SECONDS, "step": opt(INT), "elapsed_s": DURATION}, rest=ANY)))},
                   rest=ANY)
FINDING_EVIDENCE = Shape({
    "decided_by": may(opt(STR)), "curve": may(null_as([], list_of(pair(SECONDS, SIZE)))),
    "rate_bytes_per_s": may(opt(NUM)), "free_bytes": may(opt(SIZE)), "free_t": may(opt(SECONDS)),
    "time_to_full_s": may(opt(DURATION)), "root_cause": may(opt(ROOT_CAUSE)),
    "garbage": may(opt(Shape({"objects_freed": may(opt(COUNT)), "types": may(null_as([], list_of(pair(STR, COUNT))))},
                             rest=ANY)))}, rest=ANY)
# A claim and its evidence (claims.py): its name and words are checked, its evidence is data.
CLAIM = Shape({"claim": STR, "evidence": need_dict, "says": STR})
FINDING = Shape({"kind": one_of(*FINDING_KINDS), "bytes": SIZE, "summary": STR, "evidence": FINDING_EVIDENCE,
                 "remedy": STR, "pid": opt(PID), "device": opt(INT), "suspects": absent(records.SUSPECTS, []),
                 "host": opt(STR), "claims": absent(list_of(CLAIM), [])}).into(Finding)
# The parts after non_torch_bytes are absent from reports made before they were measured.
BREAKDOWN = Shape({
    "pid": PID, "device": opt(INT), "torch_index": opt(INT), "exit_probes": absent(BOOL, False), "host": opt(STR),
    **{k: opt(SIZE) for k in ("nvml_bytes", "context_bytes", "live_tensor_bytes", "garbage_bytes",
                              "pending_stream_bytes", "cache_bytes", "non_torch_bytes", "cublas_workspace_bytes",
                              "private_pool_bytes", "non_torch_warmup_bytes", "non_torch_cupy_bytes",
                              "non_torch_rest_bytes", "non_torch_nccl_bytes")},
    "nccl": opt(BOOL), "nccl_env": opt(dict_of(STR, STR)), "context_after_nccl": opt(BOOL),
    "cuda_module_loading": opt(STR),
    "non_torch_libraries": opt(list_of(pair(STR, opt(SIZE))))}).into(Breakdown)
GROWTH = Shape({"pid": PID, "device": opt(INT), "series": STR, "by": STR, "grown_bytes": SIZE,
                "rate_bytes_per_step": opt(NUM), "rate_bytes_per_s": opt(NUM), "start_step": opt(INT),
                "start_t": opt(SECONDS), "host": opt(STR)}).into(Growth)
PEAKS = Shape({"nvml_bytes": may(opt(SIZE)), "allocated_bytes": may(opt(SIZE)), "reserved_bytes": may(opt(SIZE)),
               "nvml_t": may(opt(SECONDS)), "nvml_host": may(opt(STR))}, rest=ANY)
# An accumulation, unheld group or out-of-memory error of one process and GPU's evidence: its size is
# there, as bytes or request_bytes (_sized); an error's moment is marked on the page's timeline.
SIZED = Shape({"bytes": may(SIZE), "request_bytes": may(SIZE), "t": may(opt(SECONDS))}, rest=ANY)


def _has_bytes(item: dict, what: str) -> None:
    if "bytes" not in item and "request_bytes" not in item:
        raise BadReportError(f"{what}: no bytes")


# One process and GPU's evidence: its identity and counts are checked; the rest is data.
EVIDENCE = Shape({"pid": PID, "device": may(opt(INT)), "host": may(opt(STR)), "samples": COUNT,
                  **{k: may(list_of(also(SIZED, _has_bytes))) for k in ("accumulations", "unheld", "out_of_memory")}},
                 rest=ANY)
# One rank and GPU (reports without ranks have none: they load as before).
RANK_ROW = Shape({"host": opt(STR), "pid": PID, "verdict": VERDICT,
                  **{k: opt(INT) for k in ("rank", "local_rank", "node_rank", "world_size", "device", "torch_index",
                                           "breakdown")},
                  **{k: opt(SIZE) for k in ("peak_reserved_bytes", "peak_allocated_bytes", "peak_nvml_bytes")}}
                 ).into(RankRow)
JOB = Shape({"ranks": list_of(INT), "world_size": opt(INT), "hosts": list_of(opt(STR)),
             "missing_ranks": list_of(INT), "ranks_with_leak": list_of(INT), "verdict": VERDICT,
             "summary": STR}).into(Job)
# What made a peak (reports made before it was measured have none).
PEAK_HOLDER = Shape({"name": STR, "bytes": SIZE, "line": opt(STR)})
PEAK_PART = Shape({"category": one_of(*PEAK_CATEGORIES), "bytes": SIZE, "how": STR,
                   "holders": list_of(PEAK_HOLDER)}).into(PeakPart)
PEAK_COMPOSITION = Shape({
    "pid": PID, "device": opt(INT), "torch_index": opt(INT), "t": opt(SECONDS), "step": opt(INT),
    "total_bytes": SIZE, "allocated_bytes": SIZE, "reserved_bytes": SIZE, "parts": list_of(PEAK_PART),
    "allocated_peak_bytes": opt(SIZE), "in_pause": BOOL, "where": opt(STR), "notes": list_of(STR), "host": opt(STR),
    "highest": absent(opt(Shape({"t": opt(SECONDS), "total_bytes": SIZE, "cache_bytes": SIZE})), None)}
).into(PeakComposition)
# The copies of the recording's figures that `build` writes for readers of the JSON (docs/json.md):
# the target with the run's length, the devices, the versions and the timeline. Each is read as
# strictly as the recording's own.
REPORT_TARGET = Shape({**TARGET_FIELDS, "duration_s": may(opt(DURATION))}, rest=ANY)
TIMELINE_ROW = Shape({"pid": PID, "device": opt(INT), "t": SECONDS, "step": opt(INT), "by": STR,
                      **{k: opt(SIZE) for k in ("nvml_bytes", "reserved_bytes", "active_bytes", "allocated_bytes")}})
# The report's own fields; "schema" is checked first (parse), and "recording" by the recording's shape.
REPORT = Shape({"verdict": VERDICT, "findings": list_of(FINDING), "breakdown": list_of(BREAKDOWN),
                "growth": absent(list_of(GROWTH), []), "peaks": PEAKS, "notes": absent(list_of(STR), []),
                "evidence": absent(list_of(EVIDENCE), []), "ranks": absent(list_of(RANK_ROW), []),
                "job": opt(JOB), "peak_compositions": absent(list_of(PEAK_COMPOSITION), []),
                "target": may(REPORT_TARGET), "devices": may(list_of(DEVICE)), "versions": may(VERSIONS),
                "timeline": may(list_of(TIMELINE_ROW))}, rename={"breakdown": "breakdowns"})
# The fields of REPORT that are the recording's figures again, not the diagnosis's.
COPIES = ("target", "devices", "versions", "timeline")
