"""Who is who in a job of several processes (torchrun, torch.distributed.launch, Slurm); pure.

From facts about processes (command line, parent, and the job variables of an environment
that was ours to read) it tells a launcher, its ranks and their workers apart, and groups the
processes of one job with their GPU memory, for `gpumemdoctor ps` and `gpumemdoctor watch`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from . import stray

# What a launcher's command line runs: `python -m torch.distributed.run`, or the console script.
LAUNCHER_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torch.distributed.launch"}
LAUNCHER_SCRIPTS = {"torchrun": "torchrun"}
_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}
# torchrun's --rdzv-id defaults to "none" in some versions: two unrelated jobs would share it.
_NO_RUN_ID = {"", "none"}


@dataclass(frozen=True)
class Identity:
    """A process's place in a job, as its environment says."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    run_id: str | None = None  # TORCHELASTIC_RUN_ID
    restart_count: int | None = None  # TORCHELASTIC_RESTART_COUNT
    slurm_job_id: str | None = None
    rank_variable: str | None = None  # RANK or SLURM_PROCID: where `rank` was read

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Identity:
        rank, variable = _int(env.get("RANK")), "RANK"
        if rank is None:
            rank, variable = _int(env.get("SLURM_PROCID")), "SLURM_PROCID"
        local = _int(env.get("LOCAL_RANK"))
        run_id = env.get("TORCHELASTIC_RUN_ID")
        return cls(rank=rank, local_rank=local if local is not None else _int(env.get("SLURM_LOCALID")),
                   world_size=_int(env.get("WORLD_SIZE")) or _int(env.get("SLURM_NTASKS")),
                   run_id=run_id if run_id is not None and run_id.strip().lower() not in _NO_RUN_ID else None,
                   restart_count=_int(env.get("TORCHELASTIC_RESTART_COUNT")),
                   slurm_job_id=env.get("SLURM_JOB_ID") or None,
                   rank_variable=variable if rank is not None else None)

    @property
    def in_job(self) -> bool:
        return self.rank is not None or self.run_id is not None or self.slurm_job_id is not None


def _int(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


@dataclass(frozen=True)
class ProcessFacts:
    pid: int
    ppid: int | None
    cmdline: list[str] | None
    identity: Identity | None  # None: its environment was not ours to read (or it has gone)


def launcher_kind(cmdline: list[str] | None) -> str | None:
    """'torchrun' when the command line runs torchrun or `python -m torch.distributed.run`, ...;
    None for anything else."""
    if not cmdline:
        return None
    program = os.path.basename(cmdline[0])
    if program in LAUNCHER_SCRIPTS:
        return LAUNCHER_SCRIPTS[program]
    if not program.startswith("python"):
        return None
    args, i = cmdline[1:], 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return LAUNCHER_MODULES.get(args[i + 1]) if i + 1 < len(args) else None
        if arg.startswith("-m"):
            return LAUNCHER_MODULES.get(arg[2:])
        if arg == "-c":
            return None
        if arg.startswith("-"):
            i += 2 if arg in _PYTHON_OPTIONS_WITH_VALUE else 1
            continue
        return LAUNCHER_SCRIPTS.get(os.path.basename(arg))
    return None


@dataclass(frozen=True)
class Place:
    """Where one process stands in a job."""

    pid: int
    anchor: int | None  # the launcher (the rank process's parent); None where there is none to name
    rank_pid: int | None  # the rank process it is, or works for; None for the launcher itself
    identity: Identity | None  # the rank process's (or, lacking it, this process's)

    @property
    def role(self) -> str:
        if self.rank_pid is None:
            return "launcher"
        return "rank" if self.rank_pid == self.pid else "worker"


def place(pid: int, facts: Mapping[int, ProcessFacts]) -> Place | None:
    """The process's place in a job, from its facts and its ancestors' (as far as `facts` has
    them); None when it is in no job.

    Under a launcher (found by its command line) the launcher's child on the way up is the
    rank process, whatever its environment says, so a rank of another user is still a rank
    (of unknown number). Otherwise the environment decides: the topmost process up the chain
    with the same rank is the rank process (its DataLoader workers inherit RANK), and its
    parent launched it."""
    chain = []
    current: int | None = pid
    while current is not None and current in facts and current not in chain:
        chain.append(current)
        current = facts[current].ppid
    if not chain:
        return None
    for i, ancestor in enumerate(chain):
        if launcher_kind(facts[ancestor].cmdline):
            if i == 0:
                return Place(pid, ancestor, None, facts[pid].identity)
            rank_pid = chain[i - 1]
            return Place(pid, ancestor, rank_pid, facts[rank_pid].identity or facts[pid].identity)
    own = facts[pid].identity
    if own is None or not own.in_job:
        return None
    if own.rank is None:  # in a job by its ids only
        return Place(pid, None, pid, own)
    top = pid
    for ancestor in chain[1:]:
        other = facts[ancestor].identity
        if other is None or (other.rank, other.rank_variable) != (own.rank, own.rank_variable):
            break
        top = ancestor
    parent = facts[top].ppid
    return Place(pid, parent if parent not in (None, 0, 1) else None, top, facts[top].identity)


def anchors(pids, facts: Mapping[int, ProcessFacts]) -> set[int]:
    """The launchers of these processes' jobs."""
    found = set()
    for pid in pids:
        p = place(pid, facts)
        if p is not None and p.anchor is not None:
            found.add(p.anchor)
    return found


# -- the job view of `gpumemdoctor ps` ----------------------------------------------------------

@dataclass
class JobProcess:
    """A rank, or a worker of one, or a launcher, with the GPU memory NVML says it holds."""

    pid: int
    cmdline: list[str] | None
    gpus: list[dict] = field(default_factory=list)  # {"index", "used_bytes"}, one per GPU it holds
    rank: int | None = None
    local_rank: int | None = None
    restart_count: int | None = None
    workers: list[JobProcess] = field(default_factory=list)  # those that hold GPU memory
    quiet_descendants: list[int] = field(default_factory=list)  # the rest of its descendants
    flags: list[dict] = field(default_factory=list)  # {"flag", "next_step"}


@dataclass
class Job:
    """Processes that share a launcher, a TORCHELASTIC_RUN_ID or a Slurm job."""

    launcher: JobProcess | None
    launcher_kind: str | None  # "torchrun", ...; None where the launcher is some other program
    run_id: str | None
    slurm_job_id: str | None
    world_size: int | None
    ranks: list[JobProcess]
    gpus: list[dict]  # the whole job's memory on each GPU: {"index", "used_bytes"}

    def to_json(self) -> dict:
        return asdict(self)


def group(held: Mapping[int, Mapping[int, int | None]], facts: Mapping[int, ProcessFacts],
          parents: Mapping[int, int], reserved: Mapping[int, Mapping[int, int | None]] | None = None) -> list[Job]:
    """The jobs among the processes that hold GPU memory.

    `held`: pid -> {GPU index -> bytes (None: not available)} for each process NVML lists;
    `facts`: those processes, their ancestors, and the launchers' children; `parents`: every
    process's parent, for the descendants that hold no GPU memory; `reserved`: pid -> {GPU index ->
    bytes its PyTorch reserved}, where a rank's agent said (stray.rank_flags)."""
    places = {pid: p for pid in held if (p := place(pid, facts)) is not None}
    for anchor in {p.anchor for p in places.values() if p.anchor is not None}:
        kind = launcher_kind(facts[anchor].cmdline) if anchor in facts else None
        for child, parent in parents.items():
            if parent != anchor or child in places or child not in facts:
                continue
            p = place(child, facts)
            # a rank that holds nothing yet is still one of the job's ranks
            if p is not None and p.rank_pid == child and (kind or (p.identity and p.identity.rank is not None)):
                places[child] = p
    keys = _UnionFind()
    for p in places.values():
        own = [k for k in (("launcher", p.anchor) if p.anchor is not None else None,
                           ("run", p.identity.run_id) if p.identity and p.identity.run_id else None) if k]
        if not own and p.identity and p.identity.slurm_job_id:
            own = [("slurm", p.identity.slurm_job_id)]
        if not own:
            own = [("alone", p.pid)]
        for k in own:
            keys.join(own[0], k)
        keys.join(own[0], ("pid", p.pid))
    groups: dict = {}
    for p in places.values():
        groups.setdefault(keys.find(("pid", p.pid)), []).append(p)
    jobs = [_job(members, held, facts, parents, reserved) for members in groups.values()]
    return sorted(jobs, key=lambda j: (j.launcher.pid if j.launcher else 0, [r.pid for r in j.ranks]))


def _job(members: list[Place], held, facts, parents, reserved=None) -> Job:
    def proc(pid: int, identity: Identity | None = None) -> JobProcess:
        f = facts.get(pid)
        gpus = [{"index": i, "used_bytes": b} for i, b in sorted((held.get(pid) or {}).items())]
        ident = identity or Identity()
        return JobProcess(pid=pid, cmdline=f.cmdline if f else None, gpus=gpus, rank=ident.rank,
                          local_rank=ident.local_rank, restart_count=ident.restart_count)

    anchor = min((p.anchor for p in members if p.anchor is not None), default=None)
    launcher = proc(anchor) if anchor is not None else None
    ranks: dict[int, JobProcess] = {}
    for p in sorted(members, key=lambda p: p.pid):
        if p.rank_pid is not None and p.rank_pid not in ranks:
            ranks[p.rank_pid] = proc(p.rank_pid, p.identity)
    for p in sorted(members, key=lambda p: p.pid):
        if p.role == "worker":
            ranks[p.rank_pid].workers.append(proc(p.pid))
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    listed = {p.pid for p in members}
    for rank in ranks.values():
        rank.quiet_descendants = sorted(d for d in _descendants(rank.pid, children) if d not in listed)
    flagged = stray.rank_flags([{"pid": r.pid, "rank": r.rank, "local_rank": r.local_rank,
                                 "gpus": {g["index"]: g["used_bytes"] for g in r.gpus}} for r in ranks.values()],
                               reserved)
    for rank in ranks.values():
        rank.flags = flagged.get(rank.pid, [])
    identities = [p.identity for p in members if p.identity is not None]
    everyone = [*([launcher] if launcher else []), *ranks.values(), *(w for r in ranks.values() for w in r.workers)]
    totals: dict[int, int | None] = {}
    for member in everyone:
        for g in member.gpus:
            before = totals.get(g["index"], 0)
            totals[g["index"]] = None if before is None or g["used_bytes"] is None else before + g["used_bytes"]
    return Job(launcher=launcher, launcher_kind=launcher_kind(launcher.cmdline) if launcher else None,
               run_id=next((i.run_id for i in identities if i.run_id), None),
               slurm_job_id=next((i.slurm_job_id for i in identities if i.slurm_job_id), None),
               world_size=next((i.world_size for i in identities if i.world_size), None),
               ranks=sorted(ranks.values(), key=lambda r: (r.rank is None, r.rank or 0, r.pid)),
               gpus=[{"index": i, "used_bytes": b} for i, b in sorted(totals.items())])


def _descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if child in found:
            continue
        found.append(child)
        todo.extend(children.get(child, []))
    return found


class _UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, key):
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def join(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
