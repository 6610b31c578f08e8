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

The agent never wraps a collective, nor anything the program calls. At each sample it looks at
how many process groups torch.distributed holds (`len` of its `_pg_map`: nothing is made, nothing
imported) and writes a `groups` record when that number changes: the time and step, the count and
the groups' backends; the first record with groups also has the world size, NCCL's version and the
`NCCL_*` variables of the process's environment that size its memory (SIZING). So the memory outside
PyTorch that arrives while the groups come up can be told apart after the run by when it came (the
diagnosis's nccl.py): by timing, not by a measurement of NCCL's own. At exit, where PyTorch and NCCL
can say (PyTorch 2.12 and NCCL 2.29.7 or later: `Backend.memory_stats()`, NCCL's
`ncclCommMemStats`), the NCCL-tracked memory of the communicators still alive is read on the
program's thread, after the program has ended (`exit_memory`).
"""
from __future__ import annotations

import os
import sys

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

    def __init__(self, agent):
        self.agent = agent
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
            record = {"type": "groups", "t": now, "step": self.agent.steps, "groups": live,
                      "backends": backends(groups)}
            if live and not self.described:
                self.described = True
                record.update(self._describe(groups))
            self.agent.channel.write(record)
        except Exception:
            pass

    def _describe(self, groups) -> dict:
        world = None
        for group in list(groups):
            try:
                world = max(world or 0, int(group.size()))
            except Exception:
                pass
        return {"world_size": world, "nccl_version": nccl_version(self.agent.torch),
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
