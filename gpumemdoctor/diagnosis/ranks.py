"""The ranks of a distributed job: which processes are ranks, what each held at its peak, and the
findings that only make sense across GPUs or ranks. Pure: no NVML, no torch, no files.

- `stray-context`: a process holds a CUDA context on a GPU where PyTorch's allocator never
  reserved anything, while it works on another GPU: a CUDA call made before
  `torch.cuda.set_device(local_rank)` lands on cuda:0, and so does a barrier without `device_ids`.
  A rank also holds a stray context on another rank's GPU where it reserved only a little (a
  tensor made on cuda:0 before set_device, gloo staging a CUDA tensor there). Only the program's
  own readings count (its samples and the `end` and `gc` probes): the later exit probes are the
  agent's, and agents before issue 29 allocated one element on every GPU NVML listed the process on.
- `rank-imbalance`: one rank's peak of reserved memory is well above the other ranks' (a warning:
  the job runs out of memory on that rank first).

A rank is a process whose launcher named its rank in the environment (torchrun's RANK, Open MPI's,
Slurm's; the agent reads them at start, `recording.Dist`), except a process that inherited its
parent's variables unchanged (a DataLoader worker, any helper process of a rank) and a process
that starts ranks of its own (torchrun's launcher inside an `srun` task, which has Slurm's rank).
"""
from __future__ import annotations

from . import libraries, stacks
from .judgement import Judged
from .remedies import FINDINGS
from .summaries import tell
from .summaries_ranks import rank_words, ranges, who  # noqa: F401 (the ranks' words, named here as before)
from ..recording.recording import AgentRecording, Dist, Recording
from ..stray_rule import own_gpu, stray_reason

GIB = 1 << 30
# rank-imbalance: the highest rank's peak reserved is above the median of the other ranks' peaks by
# at least this share of that median and at least this many bytes (docs/verdicts.md says why).
IMBALANCE_SHARE = 0.2
IMBALANCE_BYTES = 1 * GIB


def rank_processes(rec: Recording) -> dict[int, Dist]:
    """PID -> rank identity, for the processes of the recording that are ranks (see above)."""
    agents = {a.pid: a for a in rec.agents}
    named = {a.pid: a.dist for a in rec.agents if a.dist is not None
             and (a.dist.rank is not None or a.dist.local_rank is not None)}
    out = {}
    for pid, dist in named.items():
        agent = agents[pid]
        if (agent.cuda_origin or {}).get("dataloader_worker"):
            continue
        parent = agents.get(agent.forked_from if agent.forked_from is not None else agent.ppid)
        if parent is not None and parent.dist == dist:
            continue  # inherited unchanged: a worker or helper of the rank
        if any(a.dist is not None and a.dist != dist and pid in (a.ppid, a.forked_from) for a in rec.agents):
            continue  # it starts processes with ranks of their own: a launcher
        out[pid] = dist
    return out


# -- what a process held ------------------------------------------------------------------

PROGRAM_PROBES = ("end", "gc")  # the exit probes before the agent synchronizes and allocates itself


def _readings(agent: AgentRecording, torch_index: int) -> list:
    """The process's readings on one device as the program left them: its samples and the probes
    before the agent's own `sync` (which allocated on every listed GPU in agents before issue 29)."""
    probes = [agent.probes[p] for p in PROGRAM_PROBES if p in agent.probes]
    return [r for s in [*agent.samples, *probes] for r in s.readings if r.torch_index == torch_index]


def _most(values) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def gpus(rec: Recording, agent: AgentRecording) -> list[tuple[int | None, int | None]]:
    """(torch index, NVML index) of each GPU the process used: the devices its agent read and the
    GPUs NVML listed it on, in NVML's order."""
    found: dict = {}
    for torch_index in sorted({r.torch_index for s in [*agent.samples, *agent.probes.values()]
                               for r in s.readings}):
        device = agent.device(torch_index)
        nvml_index = device.nvml_index if device else None
        found.setdefault(nvml_index if nvml_index is not None else ("torch", torch_index),
                         (torch_index, nvml_index))
    for (pid, nvml_index), points in rec.nvml.items():
        if pid == agent.pid and any(used for _, used in points) and nvml_index not in found:
            device = next((d for d in agent.devices if d.nvml_index == nvml_index), None)
            found[nvml_index] = (device.index if device else None, nvml_index)
    return sorted(found.values(), key=lambda g: (g[1] is None, g[1] or 0, g[0] or 0))


def peaks_on(rec: Recording, agent: AgentRecording, torch_index: int | None,
             nvml_index: int | None) -> tuple[int | None, int | None, int | None]:
    """(reserved, allocated, NVML) at their highest for the process on one GPU: PyTorch's own peak
    counters (and the readings, should the program have reset them), NVML's polls and readings."""
    readings = _readings(agent, torch_index) if torch_index is not None else []
    reserved = _most([r.reserved_peak_bytes for r in readings] + [r.reserved_bytes for r in readings])
    allocated = _most([r.allocated_peak_bytes for r in readings] + [r.allocated_bytes for r in readings])
    polled = rec.nvml.get((agent.pid, nvml_index), []) if nvml_index is not None else []
    nvml_used = _most([used for _, used in polled] + [r.nvml_used_bytes for r in readings])
    return reserved, allocated, nvml_used


# -- stray-context ------------------------------------------------------------------------

def stray_contexts(rec: Recording, ranks: dict[int, Dist], skip: set) -> list[tuple[int, int, Judged]]:
    """(pid, NVML index, finding) for each GPU where a process holds memory that NVML sees but that is
    not its work: its PyTorch allocator never reserved a byte there while it did on another GPU; or,
    for a rank, the GPU is another rank's of this host, where it reserved under stray_rule.STRAY_SHARE of what it
    reserved on its own. DataLoader workers (their contexts are `child-contexts`), the (pid, NVML
    index) pairs in `skip`, processes that never started CUDA through PyTorch, and GPUs where a
    preallocating library (JAX) holds its pool (its context there is the library's) are left out."""
    reserved = {a.pid: _reserved_by_gpu(a) for a in rec.agents
                if a.cuda_t is not None and not (a.cuda_origin or {}).get("dataloader_worker")}
    most_of = {pid: {n: most for n, (_, most) in by_gpu.items()} for pid, by_gpu in reserved.items()}
    own = {pid: own_gpu(most_of[pid]) for pid in reserved if pid in ranks}
    out = []
    for agent in rec.agents:
        if agent.pid not in reserved:
            continue
        by_gpu, most_by_gpu = reserved[agent.pid], most_of[agent.pid]
        works_on = sorted(n for n, most in most_by_gpu.items() if most)
        if not works_on:
            continue
        mine = own_gpu(most_by_gpu)
        # the other ranks' own GPUs: none for a process that is no rank (only the first rule holds)
        others = ({gpu: pid for pid, gpu in own.items() if pid != agent.pid and gpu is not None and gpu != mine}
                  if agent.pid in ranks else {})
        for nvml_index, (torch_index, most) in sorted(by_gpu.items()):
            if (agent.pid, nvml_index) in skip or stray_reason(nvml_index, mine, most_by_gpu, others) is None:
                continue
            if libraries.preallocated_on(agent, torch_index):
                continue  # JAX's context and pool there: it starts every GPU it sees (library-memory says so)
            _, _, held = peaks_on(rec, agent, torch_index, nvml_index)
            if not held:
                continue
            owner = others.get(nvml_index)
            out.append((agent.pid, nvml_index,
                        _stray(agent, ranks.get(agent.pid), nvml_index, torch_index, held,
                               [mine] if most else works_on, most or 0,
                               ranks.get(owner) if owner is not None else None)))
    return out


def _reserved_by_gpu(agent: AgentRecording) -> dict[int, tuple[int, int | None]]:
    """NVML index -> (torch index, the most PyTorch reserved there while the program ran)."""
    out = {}
    for d in agent.devices:
        if d.nvml_index is not None:
            readings = _readings(agent, d.index)
            out[d.nvml_index] = (d.index, _most([r.reserved_bytes for r in readings]
                                                + [r.reserved_peak_bytes for r in readings]))
    return out


def _stray(agent: AgentRecording, dist: Dist | None, nvml_index: int, torch_index: int, held: int,
           works_on: list[int], reserved_there: int, owner: Dist | None) -> Judged:
    origin = agent.cuda_origin or {}
    line = stacks.user_line(origin.get("stack") or [])
    at = stacks.at(line) if line else None
    summary = tell("stray-context", pid=agent.pid, dist=dist, held=held, nvml_index=nvml_index,
                   torch_index=torch_index, owner_rank=owner.rank if owner else None, works_on=works_on,
                   reserved_there=reserved_there, at=at)
    return Judged(
        kind="stray-context", bytes=held, summary=summary,
        evidence={"pid": agent.pid, "rank": dist.rank if dist else None,
                  "local_rank": dist.local_rank if dist else None, "device": nvml_index,
                  "torch_index": torch_index, "bytes": held, "works_on": works_on,
                  "reserved_there_bytes": reserved_there, "owner_rank": owner.rank if owner else None,
                  "cuda_started_at": at, "thread": origin.get("thread")},
        remedy=FINDINGS["stray-context"])


# -- rank-imbalance -----------------------------------------------------------------------

def imbalance(per_rank: list[dict]) -> tuple[dict, Judged] | None:
    """The rank whose peak reserved memory is at least IMBALANCE_SHARE and IMBALANCE_BYTES above the
    median of the other ranks' peaks, with the finding; None with fewer than two ranks, or when no
    rank is. `per_rank`: one dict per rank with `rank`, `local_rank`, `pid`, `host`, `device` and
    `peak_reserved_bytes` (its highest over its GPUs)."""
    known = [r for r in per_rank if r["peak_reserved_bytes"] is not None and r["rank"] is not None]
    if len(known) < 2:
        return None
    over = []
    for r in known:
        median = _median([x["peak_reserved_bytes"] for x in known if x is not r])
        excess = r["peak_reserved_bytes"] - median
        if excess >= IMBALANCE_BYTES and excess >= IMBALANCE_SHARE * median:
            over.append((r, median, excess))
    if not over:
        return None
    top, median, excess = max(over, key=lambda o: (o[0]["peak_reserved_bytes"], -o[0]["rank"]))
    share = excess / median if median else None
    summary = tell("rank-imbalance", rank=top["rank"], peak_reserved_bytes=top["peak_reserved_bytes"],
                   device=top["device"], excess=excess, share=share, others_count=len(known) - 1, median=median,
                   also_over=sorted(o[0]["rank"] for o in over if o[0] is not top))
    return top, Judged(
        kind="rank-imbalance", bytes=excess, summary=summary,
        evidence={"rank": top["rank"], "local_rank": top["local_rank"], "pid": top["pid"],
                  "peak_reserved_bytes": top["peak_reserved_bytes"], "median_of_others_bytes": median,
                  "excess_bytes": excess, "excess_share": round(share, 4) if share is not None else None,
                  "ranks_over": sorted(o[0]["rank"] for o in over),
                  "peaks": [[r["rank"], r["peak_reserved_bytes"]] for r in sorted(known, key=lambda r: r["rank"])],
                  "threshold_share": IMBALANCE_SHARE, "threshold_bytes": IMBALANCE_BYTES},
        remedy=FINDINGS["rank-imbalance"])


def _median(values: list[int]) -> int:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) // 2


# -- the job in one line ------------------------------------------------------------------

def job_summary(count: int, hosts: list[str | None], world_size: int | None, missing: list[int],
                with_leak: list[int]) -> str:
    """'2 ranks on 1 host (node-a); leak on rank 1 only, of 2 ranks: ...', from the number of rank
    processes, their hosts, the world size, the ranks not seen and the ranks with a leak."""
    return tell("job", count=count, hosts=hosts, world_size=world_size, missing=missing, with_leak=with_leak)
