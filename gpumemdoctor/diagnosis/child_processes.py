"""The target's child processes: those still holding GPU memory after it exited, and those with contexts of their own.

From the supervisor's NVML polls and the agents' records of where CUDA started: an
`orphan-process` finding for a child alive after the target, with memory; a `child-contexts`
finding for DataLoader workers or sibling processes that each made a CUDA context on their
parent's GPU. Pure.
"""
from __future__ import annotations

from . import stacks
from .findings import Diagnosis, Finding
from .remedies import FINDINGS
from .summaries import tell
from ..recording.recording import Recording

MIN_SIBLING_CONTEXTS = 2  # children of one process with contexts on its GPU before they are called avoidable


def orphans(rec: Recording, result: Diagnosis) -> None:
    for proc in rec.processes:
        if proc.is_target or not proc.alive_after_exit:
            continue
        held = {dev: used for dev, used in proc.used_after_exit_bytes.items() if used}
        if not held:
            continue
        total = sum(held.values())
        result.findings.append(Finding(
            kind="orphan-process", bytes=total, pid=proc.pid,
            device=min(held) if len(held) == 1 else None,
            summary=tell("orphan-process", pid=proc.pid, cmdline=proc.cmdline, total_bytes=total),
            evidence={"pid": proc.pid, "cmdline": proc.cmdline, "ppid_when_seen": proc.ppid,
                      "used_bytes_by_device": {str(k): v for k, v in held.items()}},
            remedy=FINDINGS["orphan-process"].format(pid=proc.pid)))


def child_contexts(rec: Recording, result: Diagnosis, rank_pids: set = frozenset()) -> None:
    """Child processes with a CUDA context of their own on a GPU their parent uses: DataLoader
    workers that touched CUDA, or several children of one process (a pool). Each pays a context
    (about 500 MiB) that the parent could have spared them. One finding per parent and GPU; their
    own context findings give way to it (the breakdowns keep every process). The ranks of a
    distributed job are never such children: each needs its context on its own GPU, and one on
    another GPU is a `stray-context`."""
    holders: dict = {}  # NVML index -> {pid: most memory seen}
    for (pid, dev), points in rec.nvml.items():
        most = max((u for _, u in points if u), default=0)
        if most:
            holders.setdefault(dev, {})[pid] = most
    parents = {p.pid: p.ppid for p in rec.processes}
    agents = {a.pid: a for a in rec.agents}
    for a in rec.agents:
        parents.setdefault(a.pid, a.ppid)
    for dev, held in sorted(holders.items()):
        children: dict = {}
        for pid in held:
            if pid in rank_pids:
                continue
            parent = parents.get(pid)
            if parent is not None and parent in held:
                children.setdefault(parent, []).append(pid)
        for parent, pids in sorted(children.items()):
            workers = [p for p in pids if (agents.get(p) and agents[p].cuda_origin or {}).get("dataloader_worker")]
            if not workers and len(pids) < MIN_SIBLING_CONTEXTS:
                continue
            flagged = workers or pids
            rows = []
            for pid in sorted(flagged):
                origin = agents[pid].cuda_origin if pid in agents and agents[pid].cuda_origin else {}
                line = stacks.user_line(origin.get("stack") or [])
                rows.append({"pid": pid, "bytes": held[pid],
                             "context_bytes": next((b.context_bytes for b in result.breakdowns
                                                    if b.pid == pid and b.device == dev), None),
                             "dataloader_worker": origin.get("dataloader_worker"),
                             "started_cuda_at": stacks.at(line) if line else None,
                             "thread": origin.get("thread")})
            at_once, most = _at_once(rec, dev, {r["pid"] for r in rows})
            lines = sorted({r["started_cuda_at"] for r in rows if r["started_cuda_at"]})
            each = sum(r["bytes"] for r in rows) // len(rows)
            summary = tell("child-contexts", count=len(rows), workers=bool(workers), parent=parent, device=dev,
                           each_bytes=each, most=most, at_once_bytes=at_once, lines=lines[:2])
            remedy = FINDINGS["child-contexts-workers" if workers else "child-contexts"]
            result.findings.append(Finding(
                kind="child-contexts", bytes=at_once, pid=parent, device=dev, summary=summary,
                evidence={"processes": rows, "parent": parent, "count": len(rows), "most_at_once": most,
                          "bytes_at_once": at_once}, remedy=remedy))
            result.findings[:] = [f for f in result.findings
                                  if not (f.kind == "context" and f.pid in flagged and f.device == dev)]


def _at_once(rec: Recording, dev: int, pids: set) -> tuple[int, int]:
    """(most memory the processes held together on the GPU, most of them holding memory at once),
    from the supervisor's NVML polls."""
    events = sorted((t, pid, used or 0) for (pid, d), points in rec.nvml.items() if d == dev and pid in pids
                    for t, used in points)
    current: dict = {}
    most_bytes = most_count = 0
    for _, pid, used in events:
        current[pid] = used
        most_bytes = max(most_bytes, sum(current.values()))
        most_count = max(most_count, sum(1 for v in current.values() if v))
    return most_bytes, most_count
