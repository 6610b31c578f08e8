"""NCCL's memory in a process: the part of the memory outside PyTorch that came with its process groups,
and what to say when that memory grows. Pure: no NVML, no torch, no files.

NCCL allocates outside PyTorch's allocator: when a communicator is created and at the first
collectives of each kind (the buffers of each connection, sized by `NCCL_BUFFSIZE` and the number
of channels; see _agent/readings/process_groups.py). A clean NCCL job holds hundreds of MiB there for as long
as its communicators live (about 588 MiB per rank in a 2-rank DDP job on two H100s, all of it in
the first moments: docs/gpu-facts.md), beyond the allowance for CUDA's libraries; that is no growth.

How it is told apart: by **timing**. The agent writes a `groups` record at the sample where it first
sees a process group with an NCCL backend (and whenever their number changes). NCCL's part is what
the memory outside PyTorch rose by from the last reading before that record to the level it
settled at once the groups were up: the lowest reading from the later of that record and the end of
warm-up, to exit. So what loads in the same moments (cuBLAS's kernels at the first forward pass of a
DDP model, made right after its group) is counted with NCCL's, and what NCCL allocated before the
process's first PyTorch allocation (a communicator made by `init_process_group(device_id=...)`
before the model is on the GPU) would be in the figure of its CUDA context, read then: so the agent
reads the context inside that call, before NCCL sets up (`context_before`), and NCCL's part is then
what came after that reading. Where NCCL itself can say (PyTorch 2.12 and NCCL 2.29.7 or
later), the agent also reads at exit what the communicators still alive hold (`ncclCommMemStats`),
and NCCL's part is at least that. Growth after warm-up is judged as before (non_torch.py): a new
communicator at every step stays a `non-torch` finding, which then names the process groups.
"""
from __future__ import annotations

from .summaries import tell
from ..recording.recording import AgentRecording


def records(agent: AgentRecording) -> list[dict]:
    """The agent's `groups` records (none in recordings from before issue 29)."""
    return agent.root.get("groups") or []


def _is_nccl(record: dict) -> bool:
    return any("nccl" in backend.lower() for backend in record["backends"])


def arrival(agent: AgentRecording) -> dict | None:
    """The first `groups` record with an NCCL group, and what the first record with groups said of
    the world size, NCCL's version and its variables; None where NCCL never came up."""
    found = next((r for r in records(agent) if _is_nccl(r)), None)
    if found is None:
        return None
    described = next((r for r in records(agent) if r.get("nccl_env") is not None), {})
    return {"t": found["t"], "step": found["step"], "world_size": described.get("world_size"),
            "nccl_version": described.get("nccl_version"), "nccl_env": described.get("nccl_env") or {}}


def context_before(agent: AgentRecording, torch_index: int) -> int | None:
    """The context read before NCCL could set up (the agent's `context` record, made where the program
    called init_process_group(device_id=...)): NVML's figure less PyTorch's reserved bytes then. None
    where there is no such reading (no device_id, or a recording from before issue 42)."""
    for r in agent.root.get("contexts") or []:
        if r["device"] == torch_index and r["nvml"] and r["reserved"] is not None:
            return max(0, r["nvml"] - r["reserved"])
    return None


def exit_bytes(agent: AgentRecording) -> int | None:
    """What NCCL's communicators said they held at exit (None: not said, or none alive)."""
    groups = (((agent.exit_info or {}).get("parts") or {}).get("process_groups")) or {}
    return groups.get("nccl_bytes")


def part(agent: AgentRecording, ts: list[float], ys: list[int | None], warmup_end_t: float | None,
         outside: int, settled: int) -> dict | None:
    """NCCL's part of `outside` ({"bytes", "before_bytes": the level before NCCL came (None when it
    came before the first reading), "in_warmup": whether it came before warm-up ended}), or None
    where NCCL never came. `outside`: the memory outside PyTorch
    at exit, less CuPy's pool; `ts`, `ys`: its series (times, bytes) as non_torch.py judges it;
    `settled`: the level non_torch.py found it settled at after warm-up (NVML's one-reading dips
    left out), which is NCCL's level too when NCCL came before warm-up ended."""
    came = arrival(agent)
    if came is None:
        return None
    before = [y for t, y in zip(ts, ys) if y is not None and t < came["t"]]
    if not before and agent.root.get("contexts"):  # (one record a call of init_process_group: a process's)
        before = [0]  # the context was read before NCCL set up (either launch form): nothing was outside then
    in_warmup = warmup_end_t is None or came["t"] <= warmup_end_t
    if in_warmup:
        level = settled
    else:  # the groups came later in the run: the lowest level after they came
        level = min([y for t, y in zip(ts, ys) if y is not None and t >= came["t"]] + [outside])
    timed = max(0, level - (before[-1] if before else 0))
    said = exit_bytes(agent) or 0
    return {"bytes": min(outside, max(timed, said)), "before_bytes": before[-1] if before else None,
            "in_warmup": in_warmup}


def evidence(agent: AgentRecording) -> dict | None:
    """NCCL's part in a finding's evidence: when its groups came, how many, what sizes its memory."""
    came = arrival(agent)
    if came is None:
        return None
    counts = [r["groups"] for r in records(agent)]
    return {**came, "groups_first": next((r["groups"] for r in records(agent) if _is_nccl(r)), None),
            "groups_most": max(counts, default=None), "groups_records": len(counts),
            "said_at_exit_bytes": exit_bytes(agent), "attributed_by": "arrival"}


def growth_words(agent: AgentRecording) -> str:
    """What a growth outside PyTorch has to do with NCCL ('' where NCCL is not in use)."""
    ev = evidence(agent)
    if ev is None:
        return ""
    first, most = ev["groups_first"], ev["groups_most"]
    if first is not None and most is not None and most > first:
        return tell("nccl-groups-grew", first=first, most=most)
    return tell("nccl-in-use", most=most)
