"""The breakdown of one process's memory on one device at the end of the run. Pure.

    NVML used = context + live tensors + garbage-cycle tensors + pending-stream
                + allocator cache + outside PyTorch

From the agent's exit probes: `allocated` before and after gc.collect() gives live and garbage
tensors; of `active - allocated`, the blocks freed in Python but still held for stream work, only
what was held for work unfinished at exit is pending (streams.py), the rest is cache; `reserved`
less what is in use is the cache; NVML minus `reserved` minus the context is what lives outside
PyTorch's allocator (itemised, and judged for growth past warm-up, in non_torch.py).
"""
from __future__ import annotations

from . import libraries, nccl, non_torch, streams
from .findings import Breakdown
from ..recording.recording import AgentRecording, TorchSample
from ..recording.records import DeviceReading


def at_exit(agent: AgentRecording, torch_index: int, nvml_index: int | None,
            during: list[tuple[TorchSample, DeviceReading]], probes: dict, end: DeviceReading):
    """(the breakdown, the context, other libraries' pools set aside from it, the `pending` record)."""
    context, pooled = libraries.context_without_pools(context_of(during, probes.get("end"), agent, torch_index),
                                                      agent, torch_index, during[0][0].t if during else None)
    b = Breakdown(pid=agent.pid, device=nvml_index, torch_index=torch_index,
                  nvml_bytes=end.nvml_used_bytes, context_bytes=context,
                  exit_probes=probes.get("end") is not None)
    after_gc = probes.get("gc")
    if end.allocated_bytes is not None:
        b.garbage_bytes = (max(0, end.allocated_bytes - after_gc.allocated_bytes)
                           if after_gc is not None and after_gc.allocated_bytes is not None else None)
        b.live_tensor_bytes = end.allocated_bytes - (b.garbage_bytes or 0)
    pending = streams.record(agent, torch_index)
    if end.active_bytes is not None and end.allocated_bytes is not None:
        b.pending_stream_bytes = streams.held_bytes(pending, max(0, end.active_bytes - end.allocated_bytes))
    if end.reserved_bytes is not None:
        in_use = (end.allocated_bytes + b.pending_stream_bytes if b.pending_stream_bytes is not None
                  else end.active_bytes if end.active_bytes is not None else end.allocated_bytes)
        b.cache_bytes = max(0, end.reserved_bytes - (in_use or 0))
    if end.nvml_used_bytes and end.reserved_bytes is not None and context is not None:
        b.non_torch_bytes = max(0, end.nvml_used_bytes - end.reserved_bytes - context)
    return b, context, pooled, pending


def context_of(during: list[tuple[TorchSample, DeviceReading]], end: DeviceReading | None,
               agent: AgentRecording | None = None, torch_index: int = 0) -> int | None:
    """The smallest NVML minus reserved over the readings taken after the first allocation.

    Before its first allocation NVML shows only part of a context (14 MiB on an
    H200 against about 520 MiB once it is complete), so readings with nothing
    reserved do not count. The agent takes a reading right after that allocation;
    kernels that load later only add to the figure, so the smallest is normally
    that first one, and it stays right when one reading catches an allocation
    that NVML already counts and the allocator does not yet (seen once on an
    H200: 64 MiB too much in the first sample). NVML's figure for a process can also
    dip for one reading (seen once on an H100: 226 MiB between readings of 640 and
    730 MiB): a reading far below both its neighbours does not count. A process too
    short to be sampled has only its exit reading, which also holds the libraries it
    loaded. Where NCCL set up before the first allocation (init_process_group(device_id=...)),
    the agent read the context inside that call, before NCCL (nccl.context_before): that reading
    counts too, and is the smallest unless it caught more than the context (one reading's excess).
    """
    gaps = [r.nvml_used_bytes - r.reserved_bytes
            for r in [r for _, r in during] + ([end] if end is not None else [])
            if r.reserved_bytes and r.nvml_used_bytes]
    least = non_torch.lowest(gaps)
    before_nccl = nccl.context_before(agent, torch_index) if agent is not None else None
    if before_nccl is not None:
        least = before_nccl if least is None else min(least, before_nccl)
    return max(0, least) if least is not None else None
