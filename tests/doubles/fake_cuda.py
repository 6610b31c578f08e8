"""torch test double (rings 1 and 2 only, never in tests/gpu): the few parts of `torch` that the
agent's sampling path reads, served from plain numbers, and a stand-in clock.

`FakeTorch.cuda.memory_stats_as_nested_dict` builds a nested dict shaped like PyTorch's
(39 small dicts, as the real one does) from `allocated` and `reserved`, which the caller
moves; `_record_memory_history` only notes its calls. For the exit probes' parts: cuBLAS
workspaces (`workspace_bytes`, in `allocated` until `torch._C._cuda_clearCublasWorkspaces()`),
private pools (`private_pools`: PyTorch's statistic, or None for a PyTorch without it, whose
`snapshot_segments` and `cuda.graphs.graph.default_capture_stream` then stand in). With `make_agent` a real
`gpumemdoctor._agent.core.Agent` runs through hours of steps in seconds: the agent's own
`time.monotonic` is replaced by a clock the caller advances (thread time and perf_counter
stay real, so the agent's costs are real costs). Used by tests/test_agent_long.py and
benchmarks/long_run.py.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

_STATS = ("allocated_bytes", "active_bytes", "reserved_bytes", "requested_bytes", "inactive_split_bytes",
          "allocation", "active", "segment", "inactive_split")
_POOLS = ("all", "small_pool", "large_pool")


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


class _Memory:
    def __init__(self):
        self.history_calls: list[dict] = []
        self.snapshot_segments: list[dict] = []
        self.snapshots = 0

    def _record_memory_history(self, enabled="all", **kwargs):
        self.history_calls.append({"enabled": enabled, **kwargs})

    def _snapshot(self):
        self.snapshots += 1
        return {"segments": self.snapshot_segments}


class _Graph:
    default_capture_stream = None  # set by torch.cuda.graph at its first capture


class _Cuda:
    def __init__(self, owner: FakeTorch):
        self._owner = owner
        self.memory = _Memory()
        self.graphs = SimpleNamespace(graph=type("graph", (_Graph,), {}))

    def is_initialized(self) -> bool:
        return True

    def synchronize(self, index: int | None = None) -> None:
        pass

    def empty_cache(self) -> None:
        self._owner.reserved = self._owner.allocated

    def memory_stats_as_nested_dict(self, index: int) -> dict:
        o = self._owner
        figures = {"allocated_bytes": o.allocated, "active_bytes": o.allocated, "reserved_bytes": o.reserved,
                   "requested_bytes": o.allocated}
        out = {}
        for name in _STATS:
            value = figures.get(name, 0)
            out[name] = {pool: {"current": value, "peak": max(value, o.peak if name == "allocated_bytes" else 0),
                                "allocated": 0, "freed": 0} for pool in _POOLS}
        out["num_alloc_retries"] = 0
        out["num_ooms"] = 0
        if o.private_pools is not None:
            out["reserved_bytes_by_private_pools"] = {
                pool: {name: {"current": size, "peak": size, "allocated": size, "freed": 0} for name in _POOLS}
                for pool, size in o.private_pools.items()}
        return out


class _C:
    def __init__(self, owner: FakeTorch):
        self._owner = owner
        self.cleared = 0

    def _cuda_clearCublasWorkspaces(self) -> None:
        o = self._owner
        o.allocated -= o.workspace_bytes
        o.workspace_bytes = 0
        self.cleared += 1


class FakeTorch:
    """Stands in for `torch` in the agent: allocated and reserved bytes that the caller sets."""

    __version__ = "0.0 (torch test double)"

    class Tensor:
        pass

    def __init__(self):
        self.allocated = 0
        self.reserved = 0
        self.peak = 0
        self.workspace_bytes = 0  # of `allocated`: cuBLAS workspaces
        self.private_pools: dict | None = {}  # pool id -> reserved bytes; None: a PyTorch without the statistic
        self.cuda = _Cuda(self)
        self._C = _C(self)

    def empty(self, *size, device=None):
        return self.Tensor()

    def set(self, allocated: int, reserved: int | None = None) -> None:
        self.allocated = allocated
        self.reserved = max(self.reserved, allocated) if reserved is None else reserved
        self.peak = max(self.peak, allocated)


# The agent's modules whose clock is the agent's own bookkeeping (samples, the growth watch, the
# trace window, the exit record); the holder search and the event helpers keep the real clock.
_CLOCKED = ("core", "startup", "readings.sampler", "growth_watch", "readings.trace", "threads", "exit", "peak.peak")


def _set_clock(clock) -> None:
    import importlib

    for name in _CLOCKED:
        importlib.import_module(f"gpumemdoctor._agent.{name}").time = clock


def make_agent(run_dir: str, interval_s: float = 0.02, trace: str = "auto", context_bytes: int | None = None):
    """A real agent over a FakeTorch with one device, and its clock. With `context_bytes`, the
    agent's NVML figure for its process is reserved + context_bytes; without, it has no NVML."""
    from gpumemdoctor._agent.core import Agent

    clock = FakeClock()
    _set_clock(SimpleNamespace(monotonic=clock, thread_time=time.thread_time, perf_counter=time.perf_counter,
                               time=time.time, sleep=time.sleep))
    agent = Agent(run_dir, interval_s)
    agent.trace.mode = trace
    agent.shared.torch = FakeTorch()
    agent.shared.devices = [{"index": 0, "uuid": None, "pci_bus_id": None, "name": "fake", "nvml_device": None}]
    if context_bytes is not None:
        fake = agent.shared.torch

        class ProcessMemory:  # the shape of gpumemdoctor.system.nvml.ProcessMemory: one reader per device
            def __init__(self, device, pid):
                pass

            def used(self):
                return fake.reserved + context_bytes

        agent.shared.nvml = SimpleNamespace(ProcessMemory=ProcessMemory,
                                            used_by=lambda device, pid: fake.reserved + context_bytes)
        agent.shared.devices[0]["nvml_device"] = SimpleNamespace(index=0)
    agent.cuda_seen = True
    agent.prepare_reading()  # as the agent does when CUDA starts
    from gpumemdoctor._agent.neutral import top_up

    for holder in (agent.sampler.neutral, agent.history.bulk):
        while holder is not None and top_up(holder):  # as the program's first collections make it
            pass
    return agent, clock


def restore_clock() -> None:
    _set_clock(time)


def agent_fixture(run_dir: str, **kwargs):
    """A pytest fixture's body: `make_agent`, then the real clock back and the record file closed."""
    import os

    agent, clock = make_agent(run_dir, **kwargs)
    yield agent, clock
    restore_clock()
    if agent.shared.channel.fd is not None:
        os.close(agent.shared.channel.fd)
