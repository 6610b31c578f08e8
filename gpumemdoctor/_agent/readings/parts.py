"""What the exit probes measure of the parts that PyTorch's totals do not name: cuBLAS workspaces and
CUDA graphs' private pools (both inside PyTorch's reserved memory), whether NCCL is in use and what
its communicators hold (process_groups.exit_memory), and CUDA's module loading (both about the
memory outside it); and the per-process memory fraction in force, the limit of the process's memory.

Exit only, each part guarded on its own: a failure leaves its figure null, never the program.
Nothing is imported that the program did not import.
"""
from __future__ import annotations

import os
import sys

from . import process_groups
from ..search.blocks import snapshot

DEFAULT_POOL = (0, 0)  # the allocator's own pool; any other id is a private pool


def private_pools(torch, stats, indexes: list[int]) -> list[list[int]] | None:
    """[[torch index, bytes]]: PyTorch's reserved memory in private pools (CUDA graphs,
    torch.cuda.MemPool) on each device, as the program left it.

    From the allocator's `reserved_bytes_by_private_pools` statistic where PyTorch has it (10-20 us
    per device). Older versions lack it: there the segments of an allocator snapshot whose pool is
    not the default one are added up, and the snapshot is taken only when the program captured a
    CUDA graph (`torch.cuda.graph` or torch.compile's CUDA graphs), since a snapshot's cost grows
    with the blocks and their stacks. None when neither could be read."""
    try:
        out = []
        for index in indexes:
            pools = stats(index).get("reserved_bytes_by_private_pools")
            if pools is None:
                return _pools_from_snapshot(torch, indexes)
            out.append([index, sum(int(p["all"]["current"]) for p in pools.values())])
        return out
    except Exception:
        return None


def _captured_a_graph(torch) -> bool:
    graph = getattr(getattr(torch.cuda, "graphs", None), "graph", None)
    return (getattr(graph, "default_capture_stream", None) is not None
            or "torch._inductor.cudagraph_trees" in sys.modules)


def _pools_from_snapshot(torch, indexes: list[int]) -> list[list[int]] | None:
    if not _captured_a_graph(torch):
        return [[index, 0] for index in indexes]
    totals = dict.fromkeys(indexes, 0)
    for segment in snapshot(torch).get("segments", []):
        pool = segment.get("segment_pool_id")
        if pool is not None and tuple(pool) != DEFAULT_POOL and segment.get("device") in totals:
            totals[segment["device"]] += int(segment.get("total_size") or 0)
    return [[index, size] for index, size in totals.items()]


def graph_pools(torch, indexes: list[int]) -> list[list[int]] | None:
    """[[torch index, pools, reserved bytes, allocated bytes]]: the private pools of CUDA graphs (and
    torch.cuda.MemPool) on each device, from an allocator snapshot's segments, taken only where the
    program captured a CUDA graph; [] where it did not. The graphs' memory: what each pool reserved for
    its graph's replays, allocated (the static outputs) or not. None where it could not be read."""
    if not _captured_a_graph(torch):
        return []
    try:
        found: dict = {}
        for segment in snapshot(torch).get("segments", []):
            pool = segment.get("segment_pool_id")
            if pool is None or tuple(pool) == DEFAULT_POOL or segment.get("device") not in indexes:
                continue
            row = found.setdefault((segment["device"], tuple(pool)), [0, 0])
            row[0] += int(segment.get("total_size") or 0)
            row[1] += int(segment.get("allocated_size") or 0)
        out = []
        for index in indexes:
            rows = [v for (i, _), v in found.items() if i == index]
            if rows:
                out.append([index, len(rows), sum(r[0] for r in rows), sum(r[1] for r in rows)])
        return out
    except Exception:
        return None


def cublas_workspaces(torch, stats, indexes: list[int]) -> list[list[int]] | None:
    """[[torch index, bytes]]: what `torch._C._cuda_clearCublasWorkspaces()` gives back to the cache
    on each device: the cuBLAS and cuBLASLt workspaces, one per stream and thread that ran a matmul
    (32 MiB each on an H100 or H200), allocated blocks that no tensor holds.

    Called after the last probe's reading, when the program has ended: the probes' figures stay what
    they were (the workspaces count in `allocated` there), and a cuBLAS call after it (in a later
    exit hook) makes a new workspace. None where PyTorch has no such function."""
    clear = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        return None
    try:
        before = [_allocated(stats, index) for index in indexes]
        clear()
        return [[index, max(0, before[i] - _allocated(stats, index))] for i, index in enumerate(indexes)]
    except Exception:
        return None


def _allocated(stats, index: int) -> int:
    return int(stats(index)["allocated_bytes"]["all"]["current"])


def dist_backend() -> str | None:
    """The backend of torch.distributed's default process group ("nccl", "gloo",
    "cpu:gloo,cuda:nccl"), when one is initialised at exit; else None. NCCL allocates its buffers
    outside PyTorch's allocator, and how much it holds cannot be read."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return str(dist.get_backend())
    except Exception:
        return None


def memory_fraction(torch, indexes: list[int]) -> list[list] | None:
    """[[torch index, fraction, bytes]]: the per-process memory fraction in force on each device
    (torch.cuda.set_per_process_memory_fraction; 1.0 where none was set), and the bytes it allows
    of the device's total: the limit every "would fit" and headroom figure is held to. None where
    this PyTorch cannot say (no get_per_process_memory_fraction)."""
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get is None:
        return None
    try:
        out = []
        for index in indexes:
            fraction = float(get(index))
            total = int(torch.cuda.get_device_properties(index).total_memory)
            out.append([index, fraction, int(fraction * total)])
        return out
    except Exception:
        return None


def measure_at_end(torch, stats, indexes: list[int]) -> dict:
    """The parts read as the program left its memory (right after the `end` reading)."""
    try:
        groups = process_groups.exit_memory(torch)
    except Exception:
        groups = None
    return {"private_pools": private_pools(torch, stats, indexes), "dist_backend": dist_backend(),
            "module_loading": os.environ.get("CUDA_MODULE_LOADING"), "process_groups": groups,
            "memory_fraction": memory_fraction(torch, indexes), "graph_pools": graph_pools(torch, indexes)}
