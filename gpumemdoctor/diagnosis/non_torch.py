"""Memory outside PyTorch's allocator: itemised per process and GPU, and when it is called growing. Pure.

nvidia-smi shows more for a process than PyTorch reserved. The breakdown names the difference:

    NVML used - reserved = CUDA context + outside PyTorch
    outside PyTorch      = NCCL + grown in warm-up + CuPy's pool + the rest

- **NCCL**: where the process's torch.distributed groups use NCCL, what came with them (nccl.py:
  told apart by when it came), out of warm-up's level or the rest; not counted against the allowance;
- **grown in warm-up**: what the memory outside PyTorch rose to in the program's first moments
  and stayed at: kernels loaded on first use (CUDA's lazy module loading, `CUDA_MODULE_LOADING`)
  and libraries' own state (cuBLAS, cuDNN), 64-224 MiB on an H100 or H200 (NOTES.md). It is the
  lowest outside-PyTorch reading from the end of warm-up to exit, less CuPy's pool and NCCL's part;
- **CuPy's pool**: CuPy's default pool on that GPU at exit, measured by the agent;
- **the rest**: what came after warm-up besides CuPy's pool: raw `cudaMalloc`, other libraries.

Within PyTorch's reserved memory the agent measures two parts at exit: the cuBLAS workspaces
(allocated blocks no tensor holds: part of "live tensors") and CUDA graphs' private pools.

The memory outside PyTorch is called *growing* only when the growth lasts past warm-up
(growth.lasting_growth): warm-up is the first WARMUP_S seconds of the process's GPU work (from
its first allocation), or its first WARMUP_STEPS steps when it marks steps, and at least a
quarter of the run; after it, at least 8 samples over at least MIN_SPAN_S seconds (MIN_SPAN_STEPS
steps) must show the floor rising through the run and into its last third, by 16 MiB or more.
A run too short for that is not judged, and the report says so.
"""
from __future__ import annotations

from .findings import Breakdown, Finding
from ..growth import AfterWarmup, floor_growth, lasting_growth
from ..recording.recording import AgentRecording
from ..contract import MIN_GROWTH_BYTES, WARMUP_STEPS
from ..units import MIB
from ..units import format_bytes as fb
from . import nccl, suspects
from .remedies import FINDINGS, NON_TORCH_MORE
from .summaries import tell

PEAK_READINGS = 4  # a rise counts when this many readings in a row held it (their lowest is the level)
# Kernels and library state (cuBLAS, cuDNN, NCCL) loaded after CUDA starts grow the memory
# outside the allocator: by 64-138 MiB in a probe and 224 MiB in the clean Adam scenario on an
# H200 (NOTES.md). Memory outside the allocator is called non-torch when it keeps growing after
# warm-up, or when it is beyond this allowance.
LIBRARY_ALLOWANCE_BYTES = 512 * MIB
WARMUP_S = 0.5
MIN_SPAN_S = 0.5
MIN_SPAN_STEPS = 8
DIP_BYTES = 64 * MIB  # a reading this far below both neighbours is NVML's dip, not a level


def lowest(values: list[int]) -> int | None:
    """The smallest value, leaving out a reading far below both its neighbours: NVML's figure for
    a process can dip for one reading (seen once on an H100: 226 MiB between 640 and 730 MiB)."""
    kept = [v for i, v in enumerate(values)
            if not (0 < i < len(values) - 1 and v < values[i - 1] - DIP_BYTES and v < values[i + 1] - DIP_BYTES)]
    return min(kept) if kept else None


def run_peak(xs: list[float], ys: list[int | None], judged) -> dict | None:
    """The highest level the memory outside PyTorch held past warm-up (the lowest of PEAK_READINGS
    readings in a row), above its level when warm-up ended: {"level", "peak", "rise", "at"}. None
    where warm-up was not measured (non_torch.judge)."""
    since = getattr(judged, "warmup_end_x", None)
    if since is None:
        return None
    after = [(x, y) for x, y in zip(xs, ys) if y is not None and x >= since]
    if len(after) < 2 * PEAK_READINGS:
        return None
    level = min(y for _, y in after[:PEAK_READINGS])
    held = [(min(y for _, y in after[i:i + PEAK_READINGS]), after[i][0])
            for i in range(len(after) - PEAK_READINGS + 1)]
    peak, at = max(held)
    return {"level": level, "peak": peak, "rise": peak - level, "at": at}


def judge(xs: list[float], ys: list[int | None], by: str) -> AfterWarmup | None:
    """Whether the memory outside PyTorch grew past warm-up (see the module's docstring)."""
    if by == "step":
        return lasting_growth(xs, ys, WARMUP_STEPS, MIN_SPAN_STEPS, MIN_GROWTH_BYTES)
    return lasting_growth(xs, ys, WARMUP_S, MIN_SPAN_S, MIN_GROWTH_BYTES)


def too_short(xs: list[float], ys: list[int | None], judged: AfterWarmup | None) -> bool:
    """The run ended before the growth could be told from warm-up, and the floor was still rising
    by the looser rule that judges allocated memory: the shape of kernels that load on first use."""
    return judged is not None and not judged.enough and floor_growth(xs, ys, MIN_GROWTH_BYTES) is not None


def too_short_note(where: str, by: str, xs: list[float], judged: AfterWarmup, at_end: int | None) -> str:
    """What the summaries say of a rise too short to judge: the warm-up and span judging needs, in `by`'s unit."""
    warmup, span = (WARMUP_STEPS, MIN_SPAN_STEPS) if by == "step" else (WARMUP_S, MIN_SPAN_S)
    return tell("non-torch-too-short", where=where, at_end_bytes=at_end, by=by, ran=xs[-1] - xs[0],
                points=judged.points, warmup=warmup, span=span)


def itemise(b: Breakdown, agent: AgentRecording, torch_index: int, xs: list[float], ys: list[int | None],
            judged: AfterWarmup | None, ts: list[float] | None = None) -> None:
    """Fill the breakdown's parts (see the module's docstring) from the series and the exit record;
    `ts`: the series' times (where xs are steps), for NCCL's part (nccl.py)."""
    parts = (agent.exit_info or {}).get("parts")
    if parts is not None:
        b.cuda_module_loading = parts.get("module_loading")
        backend = parts.get("dist_backend")
        b.nccl = backend is not None and "nccl" in backend.lower()
        cublas = _on(parts.get("cublas_workspaces"), torch_index)
        if cublas is not None and b.live_tensor_bytes is not None:
            b.cublas_workspace_bytes = min(cublas, b.live_tensor_bytes)
        b.private_pool_bytes = _on(parts.get("private_pools"), torch_index)
    came = nccl.arrival(agent)
    if came is not None:
        b.nccl, b.nccl_env = True, came["nccl_env"]
    outside = b.non_torch_bytes
    if outside is None:
        return
    cupy = _cupy_bytes(agent, torch_index)
    if cupy is not None:
        b.non_torch_cupy_bytes = cupy = min(cupy, outside)
    since = judged.warmup_end_x if judged is not None else None
    after = [y for x, y in zip(xs, ys) if y is not None and since is not None and x >= since]
    settled = max(0, lowest(after + [outside]))
    avail = outside - (cupy or 0)
    warmup = min(settled, avail)
    times = ts if ts is not None else xs
    since_t = next((t for x, t in zip(xs, times) if x >= since), None) if since is not None else None
    share = nccl.part(agent, times, ys, since_t, avail, warmup)
    if share is not None:
        b.non_torch_nccl_bytes = share["bytes"]
        b.context_after_nccl = share["before_bytes"] is None
        # NCCL's part is out of the warm-up's level when it came during warm-up, else out of the rest
        warmup = max(0, min(warmup - share["bytes"] if share["in_warmup"] else warmup, avail - share["bytes"]))
    b.non_torch_warmup_bytes = warmup
    b.non_torch_rest_bytes = avail - warmup - (b.non_torch_nccl_bytes or 0)


def beyond_allowance(b: Breakdown, pooled: int = 0) -> bool:
    """More outside PyTorch than CUDA's libraries take, NCCL's communicators (nccl.py) and other
    libraries' preallocated pools (`pooled`, libraries.py) left out."""
    return bool(b.non_torch_bytes) and (b.non_torch_bytes - (b.non_torch_nccl_bytes or 0) - pooled
                                        > LIBRARY_ALLOWANCE_BYTES)


def _on(per_device: list | None, torch_index: int) -> int | None:
    for index, size in per_device or []:
        if index == torch_index:
            return size
    return None


def _cupy_bytes(agent: AgentRecording, torch_index: int) -> int | None:
    """CuPy's pool on this device: the agent reads it on CuPy's current device (recordings from
    before it named the device only count it for a process that used one GPU)."""
    pool = agent.cupy_pool
    if not pool or pool.get("total_bytes") is None:
        return None
    if "device" in pool:
        return pool["total_bytes"] if pool["device"] == torch_index else None
    used = {r.torch_index for s in [*agent.samples, *agent.probes.values()] for r in s.readings}
    return pool["total_bytes"] if used == {torch_index} else None


def finding(agent: AgentRecording, torch_index: int, nvml_index: int | None, where: str, size: int,
            b: Breakdown, why: str, judged: AfterWarmup | None, decided: dict | None = None) -> Finding:
    """The non-torch finding: `why` says whether it grew past warm-up or is over the allowance;
    `decided`: what decided it (judgement.outside_pytorch), added to its evidence."""
    remedy = FINDINGS["non-torch"]
    pool = agent.cupy_pool
    if pool and pool.get("total_bytes"):
        remedy += NON_TORCH_MORE["cupy-pool"].format(total=fb(pool["total_bytes"]), used=fb(pool.get("used_bytes")))
    growing = judged is not None and judged.fit is not None and nccl.arrival(agent) is not None
    summary = tell("non-torch", where=where, outside_bytes=b.non_torch_bytes, why=why,
                   nccl_growth=nccl.growth_words(agent) if growing else None,  # growing, NCCL's groups coming and going
                   nccl_bytes=b.non_torch_nccl_bytes)
    if growing:
        remedy = NON_TORCH_MORE["nccl-growth"] + remedy
    elif b.nccl:
        remedy += NON_TORCH_MORE["nccl"]
    return Finding(
        kind="non-torch", bytes=size, pid=agent.pid, device=nvml_index, summary=summary,
        evidence={"non_torch_at_end_bytes": b.non_torch_bytes, "library_allowance_bytes": LIBRARY_ALLOWANCE_BYTES,
                  "cupy_pool": pool, "warmup_bytes": b.non_torch_warmup_bytes, "rest_bytes": b.non_torch_rest_bytes,
                  "nccl": b.nccl, "nccl_bytes": b.non_torch_nccl_bytes, "nccl_detail": nccl.evidence(agent),
                  "after_warmup": judged.to_json() if judged is not None else None, **(decided or {})},
        remedy=remedy, suspects=suspects.thread_suspects(agent.root, torch_index, "non_torch"))
