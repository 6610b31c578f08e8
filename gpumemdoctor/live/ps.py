"""The survey of GPU processes (`gpumemdoctor ps`): who holds each GPU's memory right now.

Not the holder search inside a target (`_agent/search/search.py`): this looks from outside, at
processes. `gather()` reads NVML and /proc; `diagnose_holders()` is pure: from those facts
to flags (memory nobody accounts for among them), each with the next step to take.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..system import procs
from . import roles, stray
from ..contract import ENV_RUN_DIR
from ..units import MIB
from ..units import format_bytes as fb

# Memory used on a device beyond what its processes hold, below this, is not flagged:
# the driver keeps a little for itself on some versions.
UNACCOUNTED_FLOOR_BYTES = 256 * MIB


@dataclass
class Holder:
    """A process that NVML says holds memory on a GPU."""

    pid: int
    used_bytes: int | None
    visible: bool  # the PID exists in this PID namespace
    user: str | None = None
    cmdline: list[str] | None = None
    age_s: float | None = None
    rss_bytes: int | None = None
    status: str | None = None
    ppid: int | None = None
    session_leader: bool | None = None
    # In PID 1's session: started by PID 1, or by what PID 1 started (a container's processes, those of
    # a PID namespace), so a parent that is PID 1 is its own; None when not known.
    in_init_session: bool | None = None
    agent: bool | None = None  # runs gpumemdoctor's agent; None where its environment is not readable
    flags: list[dict] = field(default_factory=list)  # {"flag", "next_step"}


@dataclass
class GpuMemory:
    index: int
    uuid: str
    name: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    reserved_bytes: int | None  # driver-reserved (NVML memory info v2); None where only v1 exists
    holders: list[Holder] = field(default_factory=list)
    unaccounted_bytes: int | None = None
    flags: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def gather() -> list[GpuMemory]:
    """Read every GPU's memory and its processes (NVML), and what /proc says of each process."""
    from ..system import nvml

    gpus = []
    now = time.time()
    init_session = procs.session_id(1)
    for device in nvml.devices():
        mem = nvml.memory_info(device)
        gpu = GpuMemory(index=device.index, uuid=device.uuid, name=device.name, total_bytes=mem.total_bytes,
                        used_bytes=mem.used_bytes, free_bytes=mem.free_bytes, reserved_bytes=mem.reserved_bytes)
        for pid, used in nvml.processes(device):
            gpu.holders.append(_holder(pid, used, now, init_session))
        gpus.append(gpu)
    return gpus


def _holder(pid: int, used: int | None, now: float, init_session: int | None) -> Holder:
    info = procs.info(pid)
    if info is None:
        return Holder(pid=pid, used_bytes=used, visible=False)
    environ = procs.environ(pid)
    session = procs.session_id(pid)
    return Holder(pid=pid, used_bytes=used, visible=True, user=info.username, cmdline=info.cmdline,
                  age_s=round(now - info.create_time, 1) if info.create_time else None,
                  rss_bytes=info.rss_bytes, status=info.status, ppid=info.ppid,
                  session_leader=procs.session_leader(pid),
                  in_init_session=session == init_session if None not in (session, init_session) else None,
                  agent=(ENV_RUN_DIR in environ) if environ is not None else None)


def diagnose_holders(gpus: list[GpuMemory]) -> list[GpuMemory]:
    """Flag what needs a look on each GPU, with the next step; pure."""
    for gpu in gpus:
        for h in gpu.holders:
            h.flags = _flags(h)
        listed = sum(h.used_bytes or 0 for h in gpu.holders)
        # Only with NVML's memory info v2: v1's "used" also holds what the driver reserves
        # (480 MiB on an H100), which no process accounts for either.
        if (gpu.used_bytes is not None and gpu.reserved_bytes is not None
                and all(h.used_bytes is not None for h in gpu.holders)):
            gpu.unaccounted_bytes = max(0, gpu.used_bytes - listed)
        gpu.flags = []
        if gpu.unaccounted_bytes is not None and gpu.unaccounted_bytes >= UNACCOUNTED_FLOOR_BYTES:
            gpu.flags.append({
                "flag": "unaccounted",
                "next_step": f"{fb(gpu.unaccounted_bytes)} is used on GPU {gpu.index} but no process "
                             "NVML lists holds it: processes in other containers or VMs, a process that "
                             "is exiting, or memory NVML cannot attribute (MIG, no permission). Check "
                             "`nvidia-smi` on the host; if nothing runs, the driver may need the GPU "
                             "reset by an administrator."})
    return gpus


def _flags(h: Holder) -> list[dict]:
    flags = []
    command = " ".join(" ".join(h.cmdline or []).split())[:60]
    if not h.visible:
        flags.append({"flag": "not-in-this-namespace",
                      "next_step": f"PID {h.pid} does not exist here: it belongs to another PID namespace "
                                   "(a container). Look from the host, or run the container with "
                                   "--pid=host so PIDs match."})
        return flags
    if h.status == "zombie":
        flags.append({"flag": "zombie",
                      "next_step": f"PID {h.pid} has exited but its parent {h.ppid} has not reaped it; "
                                   f"its memory goes once the parent waits for it or exits "
                                   f"(kill or restart PID {h.ppid})."})
    elif h.ppid == 1 and h.session_leader is False and not h.in_init_session:
        # PID 1 is its parent, and did not start it: its own parent is gone (a daemon leads its own
        # session; what a container's PID 1 starts is in PID 1's session)
        flags.append({"flag": "orphaned",
                      "next_step": f"PID {h.pid} ({command}) lost its parent and was adopted by init: "
                                   "often a DataLoader worker or multiprocessing child left behind. "
                                   f"If it is not meant to run on: kill {h.pid}."})
    return flags


def gather_processes(gpus: list[GpuMemory]) -> tuple[dict[int, roles.ProcessFacts], dict[int, int]]:
    """What the job view needs: the facts of every visible holder, of its ancestors and of the
    children of each job's launcher (environments read only where they are ours), and the
    parent of every process."""
    parents = procs.parents()
    facts: dict[int, roles.ProcessFacts] = {}

    def add(pid: int) -> None:
        if pid not in facts and (f := _facts(pid)) is not None:
            facts[pid] = f

    holders = {h.pid for gpu in gpus for h in gpu.holders if h.visible}
    for pid in sorted(holders):
        current: int | None = pid
        while current not in (None, 0) and current not in facts:
            add(current)
            current = parents.get(current)
    for anchor in sorted(roles.anchors(holders, facts)):
        for child, parent in parents.items():
            if parent == anchor:
                add(child)
    return facts, parents


def _facts(pid: int) -> roles.ProcessFacts | None:
    info = procs.info(pid)
    if info is None:
        return None
    env = procs.environ(pid)
    return roles.ProcessFacts(pid=pid, ppid=info.ppid, cmdline=info.cmdline,
                             identity=roles.Identity.from_environ(env) if env is not None else None)


def agents_reserved(gpus: list[GpuMemory]) -> dict[int, dict[int, int | None]]:
    """pid -> {GPU index -> bytes its PyTorch reserved}, for each holder whose agent answers on its
    socket (a process of `gpumemdoctor run`): what tells a stray context for certain."""
    from ..system import agent_socket

    out = {}
    for pid in sorted({h.pid for gpu in gpus for h in gpu.holders if h.agent}):
        reply = agent_socket.query(pid)
        if reply is not None:
            out[pid] = stray.reserved_of(reply)
    return out


def find_jobs(gpus: list[GpuMemory], facts: dict[int, roles.ProcessFacts], parents: dict[int, int],
              reserved: dict[int, dict[int, int | None]] | None = None) -> list[roles.Job]:
    """The jobs among the holders (pure): launcher, ranks with their workers, per-GPU totals, and
    each rank's stray contexts (`reserved`: agents_reserved)."""
    held: dict[int, dict[int, int | None]] = {}
    for gpu in gpus:
        for h in gpu.holders:
            if h.visible:
                held.setdefault(h.pid, {})[gpu.index] = h.used_bytes
    return roles.group(held, facts, parents, reserved)


def busy_gpus(gpus: list[GpuMemory], allowed_bytes: int) -> list[tuple[int, int]]:
    """(GPU index, bytes held) for each GPU holding more than allowed: its processes, and unaccounted
    memory from UNACCOUNTED_FLOOR_BYTES up."""
    busy = []
    for gpu in gpus:
        # Unaccounted memory below the floor is the driver's own (3.25 MiB on an idle H200).
        unaccounted = gpu.unaccounted_bytes or 0
        held = sum(h.used_bytes or 0 for h in gpu.holders) + (
            unaccounted if unaccounted >= UNACCOUNTED_FLOOR_BYTES else 0)
        if held > allowed_bytes:
            busy.append((gpu.index, held))
    return busy
