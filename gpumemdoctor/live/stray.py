"""Stray contexts seen from outside a running job (`gpumemdoctor ps`, `gpumemdoctor watch`); pure.

A rank normally works on one GPU. When it also holds memory on another GPU, that is most often a
CUDA context made by a CUDA call before the rank chose its device (until then, GPU 0), and it takes
about 500 MiB from whatever works on that GPU. From outside, NVML says only how much each process
holds on each GPU; where a rank runs gpumemdoctor's agent, the agent's socket also says how much its
PyTorch reserved on each GPU. So, for each rank of a job:

- its own GPU is the one where its PyTorch reserved the most (from its agent), or else the one where
  it holds the most (from NVML);
- a `stray-context`, by the rule of `gpumemdoctor.stray_rule`: it holds memory on a GPU where its
  agent says PyTorch reserved nothing while it reserved on another (certain), or on another rank's
  own GPU, where its agent (if any) says PyTorch reserved under STRAY_SHARE of its own GPU's;
- `context-on-several-gpus`: it holds memory on several GPUs and neither rule tells which is stray
  (no agent, and no other rank works on those GPUs).

The same rule judges a finished run's recording in diagnosis/ranks.py.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..stray_rule import UNRESERVED, own_gpu, stray_reason
from ..units import format_bytes as fb


def _own(gpus: Mapping[int, int | None], reserved: Mapping[int, int | None] | None) -> int | None:
    """Where its PyTorch reserved the most, or else where it holds the most (NVML)."""
    mine = own_gpu(reserved or {})
    if mine is not None:
        return mine
    held = [(size or 0, -gpu, gpu) for gpu, size in gpus.items()]
    return max(held)[2] if held else None


def rank_flags(ranks: list[dict], reserved: Mapping[int, Mapping[int, int | None]] | None = None) -> dict[int, list[dict]]:
    """pid -> its flags, for the ranks of one job (on one host).

    `ranks`: {"pid", "rank", "local_rank", "gpus": {NVML index: bytes held (None: not known)}} each;
    `reserved`: pid -> {NVML index: bytes its PyTorch reserved}, for the ranks whose agent answered.
    A flag: {"flag", "pid", "rank", "gpu", "bytes", "how", "next_step"} ("gpu", "bytes" and "how",
    how it was told, only on a stray-context)."""
    reserved = reserved or {}
    own = {r["pid"]: _own(r["gpus"], reserved.get(r["pid"])) for r in ranks if r["gpus"]}
    out: dict[int, list[dict]] = {}
    for r in ranks:
        pid, gpus = r["pid"], r["gpus"]
        mine = own.get(pid)
        if mine is None or len(gpus) < 2:
            continue
        by_agent = reserved.get(pid) or {}
        others = {gpu: other for other, gpu in own.items() if other != pid and gpu is not None and gpu != mine}
        flags = []
        for gpu in sorted(gpus):
            reason = stray_reason(gpu, mine, by_agent, others)
            if reason is None:
                continue
            if reason == UNRESERVED:
                how = "its PyTorch reserved nothing there"
            else:
                owner = next((x for x in ranks if x["pid"] == others[gpu]), {})
                how = f"the GPU of rank {_name(owner.get('rank'))} (PID {others[gpu]})"
            flags.append(_stray(r, gpu, gpus[gpu], mine, how))
        if not flags:
            flags.append(_several(r))
        out[pid] = flags
    return out


def _name(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def _stray(r: dict, gpu: int, held: int | None, mine: int, how: str) -> dict:
    local = f" (LOCAL_RANK is {r['local_rank']} here)" if r.get("local_rank") is not None else ""
    return {"flag": "stray-context", "pid": r["pid"], "rank": r.get("rank"), "gpu": gpu, "bytes": held,
            "how": how,
            "next_step": f"rank {_name(r.get('rank'))} (PID {r['pid']}) holds {fb(held)} on GPU {gpu}, {how}, while "
                         f"it works on GPU {mine}: a CUDA context it does not need, made by a CUDA call before "
                         f"it chose its device (until then, GPU 0). Call torch.cuda.set_device(local_rank) "
                         f"before any CUDA call{local}, pass device_id to init_process_group and device_ids to "
                         "barrier(), or give each rank only its GPU with CUDA_VISIBLE_DEVICES."}


def _several(r: dict) -> dict:
    """A rank on several GPUs where neither rule tells which context is stray."""
    name = f"rank {r['rank']}" if r.get("rank") is not None else "a rank of unknown number"
    on = [f"GPU {g} ({fb(b)})" for g, b in sorted(r["gpus"].items())]
    where = f"{', '.join(on[:-1])} as well as on {on[-1]}"
    local = f" (LOCAL_RANK is {r['local_rank']} here)" if r.get("local_rank") is not None else ""
    others = "the other context is most likely stray" if len(on) == 2 else "the other contexts are most likely stray"
    return {"flag": "context-on-several-gpus", "pid": r["pid"], "rank": r.get("rank"),
            "next_step": f"{name} (PID {r['pid']}) holds a CUDA context on {where}. Which GPU its work is on "
                         f"is unknown from outside, but a rank normally uses one GPU: {others}, made by a CUDA "
                         f"call before the rank chose its device (until then, GPU 0). Call "
                         f"torch.cuda.set_device(local_rank) before any CUDA call{local}, and name devices "
                         "cuda:{local_rank}, not cuda."}


def reserved_of(reply: dict) -> dict[int, int | None]:
    """NVML index -> bytes its PyTorch reserved there, from an agent's `stats` answer
    (system/agent_socket.py); a device without an NVML index, or a figure that is no size, is left
    out."""
    out: dict[int, int | None] = {}
    for d in reply.get("devices") or []:
        if not isinstance(d, dict):
            continue
        index, size = d.get("nvml_index"), d.get("reserved_bytes")
        if isinstance(index, int) and not isinstance(index, bool):
            out[index] = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    return out
