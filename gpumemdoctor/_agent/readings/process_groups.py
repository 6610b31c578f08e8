"""torch.distributed's process groups as the agent sees them, for NCCL's memory: when they came up, how
many are alive, and what sizes NCCL's memory; at exit, what NCCL's communicators say they hold.

NCCL allocates its memory outside PyTorch's allocator, through CUDA directly: when a communicator
is created (its device-side structures, and the kernels it loads), and, since NCCL 2.22
(`NCCL_RUNTIME_CONNECT=1`, the default), its buffers at the first collective that needs each kind of
connection (ring, tree, NVLS, a new peer's send/recv). Each connection's buffers take
`NCCL_BUFFSIZE` (4 MiB by default, the Simple protocol) and the LL and LL128 protocols' own, once
per channel (`NCCL_MIN_NCHANNELS`, `NCCL_MAX_NCHANNELS`); NVLink SHARP (`NCCL_NVLS_ENABLE`) adds
multicast buffers of its own. PyTorch makes a communicator per process group and device, when the
group comes up with a bound device (`init_process_group(device_id=...)`) or at its first collective.

The agent never wraps a collective. At each sample it looks at
how many process groups torch.distributed holds (`len` of its `_pg_map`: nothing is made, nothing
imported) and writes a `groups` record when that number changes: the time and step, the count and
the groups' backends; the first record with groups also has the world size, NCCL's version and the
`NCCL_*` variables of the process's environment that size its memory (SIZING). So the memory outside
PyTorch that arrives while the groups come up can be told apart after the run by when it came (the
diagnosis's nccl.py): by timing, not by a measurement of NCCL's own. At exit, where PyTorch and NCCL
can say (PyTorch 2.12 and NCCL 2.29.7 or later: `Backend.memory_stats()`, NCCL's
`ncclCommMemStats`), the NCCL-tracked memory of the communicators still alive is read on the
program's thread, after the program has ended (`exit_memory`). Where the program binds its group to
its device, the context is read before NCCL sets up (`install_context_reading`: the one call of the
program's that the agent wraps, besides os._exit).
"""
from __future__ import annotations

import os
import sys
import time

from ..neutral import quiet_gc
from .streams import allocate_one

MAX_RECORDS = 256  # then only the exit record says how many groups are alive
# Words in the names of NCCL's variables that size its memory (docs.nvidia.com, NCCL's environment
# variables): buffers, channels and CTAs, NVLink SHARP, peer-to-peer and shared memory transports,
# lazy connection, cuMem, the algorithms and protocols (each has its buffers), registration, the FIFO.
SIZING = ("BUFFSIZE", "NCHANNELS", "CTAS", "NVLS", "P2P", "CHUNKSIZE", "SHM_DISABLE", "RUNTIME_CONNECT",
          "CUMEM", "ALGO", "PROTO", "SHARED_BUFFERS", "COLLNET", "REGISTER", "FIFO")
MAX_VARIABLES = 32
MAX_VALUE_CHARS = 100


def sizing_env(env) -> dict[str, str]:
    """The NCCL_* variables of `env` that size NCCL's memory (at most MAX_VARIABLES, values cut)."""
    found = {}
    for name in sorted(env):
        if name.startswith("NCCL_") and any(word in name for word in SIZING):
            found[name] = str(env[name])[:MAX_VALUE_CHARS]
            if len(found) >= MAX_VARIABLES:
                break
    return found


def nccl_version(torch) -> str | None:
    """'2.27.5' from PyTorch's own NCCL (a C call; nothing imported); None without one."""
    try:
        version = int(torch._C._nccl_version())
    except Exception:
        return None
    return f"{version >> 32}.{(version >> 16) & 65535}.{version & 65535}"


class ProcessGroups:
    """The count of live process groups, checked at each sample; a record when it changes."""

    def __init__(self, shared):
        self.shared = shared
        self.live = 0
        self.records = 0
        self.described = False

    def check(self, now: float) -> None:
        """At a sample: one dict lookup while torch.distributed is not imported, one `len` after."""
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is None:
            return
        groups = getattr(c10d, "_pg_map", None)
        if groups is None:
            return
        live = len(groups)
        if live == self.live:
            return
        self.live = live
        if self.records >= MAX_RECORDS:
            return
        self.records += 1
        try:
            record = {"type": "groups", "t": now, "step": self.shared.steps, "groups": live,
                      "backends": backends(groups)}
            if live and not self.described:
                self.described = True
                record.update(self._describe(groups))
            self.shared.channel.write(record)
        except Exception:
            pass

    def _describe(self, groups) -> dict:
        world = None
        for group in list(groups):
            try:
                world = max(world or 0, int(group.size()))
            except Exception:
                pass
        return {"world_size": world, "nccl_version": nccl_version(self.shared.torch),
                "nccl_env": sizing_env(os.environ)}


def backends(groups) -> list[str]:
    """The backends of the live groups ('nccl', 'gloo', 'cpu:gloo,cuda:nccl'), each once."""
    found = set()
    for value in list(groups.values()):
        try:
            found.add(str(value[0])[:40])
        except Exception:
            pass
    return sorted(found)


def exit_memory(torch) -> dict | None:
    """At exit, on the program's thread: the live groups, and the NCCL-tracked GPU memory of their
    NCCL communicators (`total` of `Backend.memory_stats()`, added up; None where PyTorch or NCCL
    cannot say). None when the program never imported torch.distributed."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    groups = getattr(c10d, "_pg_map", None) if c10d is not None else None
    if groups is None:
        return None
    total = None
    for group, value in list(groups.items()):
        if "nccl" not in str(value[0]).lower():
            continue
        try:
            stats = group._get_backend(torch.device("cuda")).memory_stats()
            total = (total or 0) + int(stats["total"])
        except Exception:
            continue
    return {"groups": len(groups), "nccl_bytes": total}


def install_context_reading(shared, sampler, torch) -> None:
    """Read the CUDA context before NCCL can set up, where the program binds its default group to a
    device (`init_process_group(device_id=...)`, PyTorch's recommended form): NCCL then makes its
    communicator inside that call, before the program's first allocation, and a context read at that
    allocation would hold NCCL's memory too.

    Besides `os._exit` (exit.py), this is the one function of the program's that the agent wraps:
    `init_process_group`, in torch.distributed and its distributed_c10d module, with the same name,
    signature and docstring; only in the process that installed it (a forked child's call goes
    straight through), and with automatic collection held off while it reads.
    The wrapper calls the original with the same arguments and returns what it returns; before
    that, for NCCL, where `device_id` names the CUDA device that is current (CUDA started: set_device
    came first, as PyTorch recommends), it completes the context there
    (one small allocation through PyTorch's allocator, freed at once: the 2 MiB segment it reserves
    is the one the program's first small tensor would take) and writes a `context` record: NVML's
    figure for the process and PyTorch's reserved bytes. It never creates a context on another device,
    and any failure leaves the call as it was. Without `device_id` a record says so (device -1): NCCL
    then sets up at the group's first collective, on a tensor, after the context's reading at the first
    allocation."""
    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    original = getattr(c10d, "init_process_group", None)
    if original is None or getattr(original, "_gpumemdoctor", False):
        return
    import functools

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if shared.pid == os.getpid() and not shared.finished:  # not a forked child's (its agent is its own)
            try:
                with quiet_gc():
                    _before_nccl(shared, sampler, torch, args, kwargs)
            except Exception:
                pass
        return original(*args, **kwargs)

    init_process_group._gpumemdoctor = True
    c10d.init_process_group = init_process_group
    if dist is not None and getattr(dist, "init_process_group", None) is original:
        dist.init_process_group = init_process_group


def _before_nccl(shared, sampler, torch, args: tuple, kwargs: dict) -> None:
    """The `context` record for one call of init_process_group (see install_context_reading)."""
    device_id = kwargs.get("device_id", args[8] if len(args) > 8 else None)
    backend = kwargs.get("backend", args[0] if args else None)
    if backend is not None and "nccl" not in str(backend).lower():
        return  # gloo or another backend: no NCCL memory to tell apart
    if device_id is None:  # NCCL sets up at the group's first collective, on a tensor: after the first allocation
        shared.channel.write({"type": "context", "t": time.monotonic(), "device": -1, "nvml": None,
                              "reserved": None, "why": "init_process_group without device_id"})
        return
    index = device_id if isinstance(device_id, int) else (
        device_id.index if getattr(device_id, "type", None) == "cuda" else None)
    # Only a device already started and current: the agent never starts CUDA, nor makes a context on
    # another device (device_id before set_device: NCCL's memory then stays in the context's figure).
    if index is None or not torch.cuda.is_initialized() or index != torch.cuda.current_device():
        return
    if not shared.devices or sampler.neutral is None:
        return
    if not torch.cuda.memory_reserved(index):
        allocate_one(torch, index)  # completes the context (NVML shows part of it before)
    locked = sampler.lock.acquire(timeout=0.05)
    try:
        rows = sampler.read_devices()
    finally:
        if locked:
            sampler.lock.release()
    for row in rows:
        if row[0] == index:
            shared.channel.write({"type": "context", "t": time.monotonic(), "device": index, "nvml": row[5],
                                  "reserved": row[3], "why": "before init_process_group(device_id=...)"})
