"""Other GPU libraries in a process (JAX/XLA, CuPy, Numba, TensorFlow): their memory is not the CUDA
context, and it is named with its library and the switch that governs it. Pure.

- **The context.** The context is read from NVML at PyTorch's first allocation (breakdown.context_of).
  A library that preallocates (JAX/XLA takes 75% of the GPU at its first use) and started before
  that moment is in the same reading. Its pool, by the library's own statistics (read by the agent
  at exit, never by starting the library), is taken out of the context and shown as its own part
  of the memory outside PyTorch (`non_torch_libraries`).
- **Over the whole run.** Memory outside PyTorch is judged at exit and for lasting growth
  (non_torch.py), and so is a rise past warm-up that a window of readings held, whatever was left
  at exit (`non_torch.run_peak`, judgement row 11): memory let go of at shutdown still grew.
- **Named.** A non-torch finding names the libraries the process imported (and when), the live
  arrays of other libraries at exit (by `__cuda_array_interface__`), and each library's switch.
"""
from __future__ import annotations

from .findings import Breakdown, Finding
from .remedies import FINDINGS, LIBRARY_SWITCHES
from .summaries import tell
from ..recording.recording import AgentRecording
from ..units import MIB

MIN_CONTEXT_BYTES = 256 * MIB  # less than any context measured (518 MiB and up on H100 and H200)
MIN_POOL_BYTES = 64 * MIB  # a pool below this is not worth a finding
PREALLOCATING = ("jax",)  # pools set aside at the library's first use, read from its own statistics
# name -> (the library as the report says it, what its memory is); its switch is remedies.LIBRARY_SWITCHES
LIBRARIES = {
    "jax": ("JAX/XLA", "XLA's memory pool, preallocated at JAX's first use (75% of the GPU by default)"),
    "cupy": ("CuPy", "CuPy's arrays and its default memory pool"),
    "numba": ("Numba", "Numba's device arrays (numba.cuda.device_array, to_device)"),
    "tensorflow": ("TensorFlow", "TensorFlow's allocator, which maps most of the GPU at its start"),
}


def imported(agent: AgentRecording) -> list[dict]:
    """The known GPU libraries the process imported, with when ({"name", "t"})."""
    return (agent.root or {}).get("libraries") or []


def pools_on(agent: AgentRecording, torch_index: int) -> list[dict]:
    return [p for p in ((agent.exit_info or {}).get("libraries") or []) if p["device"] == torch_index
            and p["bytes"] >= MIN_POOL_BYTES]


def preallocated_on(agent: AgentRecording, torch_index: int) -> bool:
    """Whether a preallocating library (JAX) held its pool on that device at exit: such a library
    starts every GPU it can see, so the process's context there is the library's."""
    return any(p["name"] in PREALLOCATING for p in pools_on(agent, torch_index))


def context_without_pools(context: int | None, agent: AgentRecording, torch_index: int,
                          first_t: float | None) -> tuple[int | None, int]:
    """(the context, what was taken out of it): a preallocating library's pool, where the library
    was imported before the reading the context comes from and that reading holds the pool too."""
    if context is None or first_t is None:
        return context, 0
    started = {x["name"]: x["t"] for x in imported(agent)}
    moved = 0
    for p in pools_on(agent, torch_index):
        if p["name"] in PREALLOCATING and started.get(p["name"], first_t) < first_t \
                and context - moved >= p["bytes"] + MIN_CONTEXT_BYTES:
            moved += p["bytes"]
    return context - moved, moved


def itemise(b: Breakdown, agent: AgentRecording, torch_index: int) -> None:
    """Preallocated pools as their own part of the memory outside PyTorch, taken out of warm-up
    (where they come, at the library's first use) and then the rest."""
    found = [p for p in pools_on(agent, torch_index) if p["name"] in PREALLOCATING]
    if not found or b.non_torch_bytes is None:
        return
    b.non_torch_libraries = []
    left = b.non_torch_bytes - (b.non_torch_cupy_bytes or 0) - (b.non_torch_nccl_bytes or 0)
    for p in found:
        size = min(p["bytes"], max(0, left))
        left -= size
        b.non_torch_libraries.append([LIBRARIES[p["name"]][0], size])
        take = min(size, b.non_torch_warmup_bytes or 0)
        b.non_torch_warmup_bytes = (b.non_torch_warmup_bytes or 0) - take
        b.non_torch_rest_bytes = max(0, (b.non_torch_rest_bytes or 0) - (size - take))


def pooled_bytes(b: Breakdown) -> int:
    return sum(size for _, size in b.non_torch_libraries or [])


def name_holders(f: Finding, agent: AgentRecording) -> None:
    """What the report knows of who held memory outside PyTorch: the libraries the process
    imported, the other libraries' arrays alive at exit, each library's switch."""
    libraries = imported(agent)
    arrays = (agent.exit_info or {}).get("foreign_arrays") or []
    f.evidence["libraries"] = libraries
    f.evidence["foreign_arrays"] = arrays
    if arrays:
        f.summary += tell("foreign-arrays", arrays=arrays[:3])
    known = [x for x in libraries if x["name"] in LIBRARIES]  # (a newer agent's may name more)
    if known:
        f.summary += tell("libraries-imported", named=[(LIBRARIES[x["name"]][0], x["t"]) for x in known])
        f.remedy += tell("library-switches", switches=[(LIBRARIES[x["name"]][0], LIBRARY_SWITCHES[x["name"]])
                                                       for x in known])


def pool_findings(agent: AgentRecording, torch_index: int, nvml_index: int | None, where: str,
                  moved: int) -> list[Finding]:
    """Judgement row 12: a preallocated pool informs, named with its library and its switch."""
    out = []
    for p in pools_on(agent, torch_index):
        if p["name"] not in PREALLOCATING:
            continue
        label, what = LIBRARIES[p["name"]]
        out.append(Finding(
            kind="library-memory", bytes=p["bytes"], pid=agent.pid, device=nvml_index,
            summary=tell("library-memory", where=where, pool_bytes=p["bytes"], what=what,
                         in_use_bytes=p.get("in_use_bytes"), taken_from_context=bool(moved)),
            evidence={"decided_by": "library-statistics", "library": p["name"], "pool": p,
                      "taken_from_context_bytes": moved},
            remedy=FINDINGS["library-memory"].format(label=label, switch=LIBRARY_SWITCHES[p["name"]])))
    return out
