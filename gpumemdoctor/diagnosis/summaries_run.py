"""The words of how a process ran and ended: the longest step gap (step_gaps.py), an end not seen
(ends.py), NCCL's part in a growth (nccl.py), other GPU libraries (libraries.py), the processes seen
by NVML only (diagnose.py) and the target's children (child_processes.py), which those modules
decide. Pure.

The same registry as summaries.py's (summaries_registry.py): each sentence a registered function, its
keyword arguments the facts its module decided; `tell(name, **facts)` makes it. `PART_WORDS`: each of
the agent's parts as the step gap's note names it.
"""
from __future__ import annotations

from .summaries_registry import summary as _summary
from ..units import format_bytes as fb

# Each of the agent's parts (contract.AGENT_PARTS) as the step gap's note names it.
PART_WORDS = {"step_end": "its work at the step's end", "sample": "its samples", "growth_watch": "its growth watch",
              "phase_watch": "its watch for pauses", "peak_watch": "its peak watch",
              "history": "its allocation history", "history_read": "its reading of the peak's allocation history",
              "peak_probe": "its probe of the peak's names", "phase_search": "its holder search at a pause",
              "growth_search": "its growth search (a copy of the process)", "collector": "its collector callback"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


# -- the longest step gap (step_gaps.py) ------------------------------------------------------

@_summary("step-gap")
def _step_gap(pid: int, between: str, gap_s: float, step: int, typical_s: float | None,
              collection_s: float | None, generation: int | None, agent_s: float,
              parts: list[tuple[str, float]], rest_s: float | None) -> str:
    """The note on the longest gap between two steps (`between`: "starts" or "ends"): what it held,
    the collections (`collection_s`: None where none ran in it), the agent's own work and its parts
    shown (name, seconds), and the rest where it stands out (`rest_s`: None where it is not told)."""
    held = []
    if collection_s is not None:
        which = ("a full garbage collection (generation 2)" if generation == 2
                 else f"garbage collection (generation {generation})")
        held.append(f"{which} {_ms(collection_s)}")
    split = f" ({', '.join(f'{PART_WORDS[name]} {_ms(s)}' for name, s in parts)})" if parts else ""
    held.append(f"gpumemdoctor's own work {_ms(agent_s)}{split}")
    if rest_s is not None:
        held.append(f"{_ms(rest_s)} that was neither (the program's own work, or a wait outside Python)")
    scale = f" (the median of the gaps before it: {_ms(typical_s)})" if typical_s is not None else ""
    what = "two steps' starts" if between == "starts" else "two step ends"
    return (f"process {pid}: the longest gap between {what} was {_ms(gap_s)}, at step "
            f"{step}{scale}; in it: {', '.join(held)}")


# -- how a process ended, where its exit probes did not run (ends.py) -------------------------

@_summary("ended-hard-exit")
def _ended_hard_exit(status: int | None, t: float) -> str:
    """How it ended (`ends.how_ended`'s "text"): through os._exit(status)."""
    return f"left through os._exit({'' if status is None else status}) at {t:.1f} s"


@_summary("ended-by-signal")
def _ended_by_signal(number: int, signal_name: str | None) -> str:
    """Killed by a signal (`signal_name`: None where its number has no name)."""
    return f"was killed by {signal_name if signal_name is not None else f'signal {number}'}"


@_summary("ended-unseen")
def _ended_unseen() -> str:
    return "ended without running its exit hook (killed, or os._exit before the agent could see it)"


@_summary("end-not-seen-note")
def _end_not_seen_note(pid: int, ended: dict, last_t: float | None) -> str:
    """The report's note on a process whose end was not seen (`last_t`: None where its agent never
    read PyTorch's allocator)."""
    read = (f"the last reading of its agent was at {last_t:.1f} s" if last_t is not None
            else "its agent never read PyTorch's allocator")
    return (f"the end of process {pid} was not seen: it {ended['text']}, so its exit probes "
            f"(gc.collect(), the holder search, the breakdown at exit) never ran; the report uses what "
            f"its agent recorded until then ({read})")


# -- NCCL in a growth outside PyTorch (nccl.py) -----------------------------------------------

@_summary("nccl-groups-grew")
def _nccl_groups_grew(first: int, most: int) -> str:
    """The process groups went from `first`, when NCCL came up, to `most`."""
    return (f" NCCL is in use, and the process's torch.distributed process groups went from {first} when "
            f"NCCL came up to {most}: each new group (torch.distributed.new_group, a new DeviceMesh) "
            f"makes NCCL communicators with buffers of their own.")


@_summary("nccl-in-use")
def _nccl_in_use(most: int | None) -> str:
    """The process groups did not grow (`most`: the most there were)."""
    return (f" NCCL is in use ({most} process group{'s' if most != 1 else ''} throughout): its communicators "
            f"also grow as they first connect to a peer (send/recv to a rank not reached before) or "
            f"register buffers.")


# -- other GPU libraries (libraries.py) -------------------------------------------------------

@_summary("foreign-arrays")
def _foreign_arrays(arrays: list) -> str:
    """Other libraries' arrays alive at exit, those the finding names ([type, count, bytes])."""
    return " Alive at exit: " + ", ".join(f"{n} {t.rsplit('.', 1)[-1]} of {t.split('.')[0]} ({fb(size)})"
                                          for t, n, size in arrays) + "."


@_summary("libraries-imported")
def _libraries_imported(named: list[tuple[str, float]]) -> str:
    """The known GPU libraries the process imported (the library as the report says it, when)."""
    named_words = [f"{label} (imported at {t:.1f} s)" for label, t in named]
    return f" GPU libraries in the process besides PyTorch: {', '.join(named_words)}."


@_summary("library-switches")
def _library_switches(switches: list[tuple[str, str]]) -> str:
    """The remedy's words for those libraries: each one's switch (remedies.LIBRARY_SWITCHES)."""
    return " " + " ".join(f"{label}: {switch}." for label, switch in switches)


@_summary("library-memory")
def _library_memory(where: str, pool_bytes: int, what: str, in_use_bytes: int | None,
                    taken_from_context: bool) -> str:
    """A preallocated pool (`what`: what its memory is, libraries.LIBRARIES)."""
    context = " It was set aside before PyTorch's first allocation, so it is not counted as the context." \
        if taken_from_context else ""
    return (f"{fb(pool_bytes)} in {where} is {what}; {fb(in_use_bytes)} of it was in use at "
            f"exit. PyTorch cannot use it.{context}")


# -- what NVML alone saw (diagnose.py) --------------------------------------------------------

@_summary("nvml-unavailable")
def _nvml_unavailable() -> str:
    return "no NVIDIA GPU was measured: NVML was not available"


@_summary("nvml-listed-none")
def _nvml_listed_none(pids: list[int]) -> str:
    """Processes that used CUDA, of which NVML listed no memory."""
    return (f"NVML listed no memory for process {', '.join(map(str, pids))} although it used CUDA: "
            "in a container, run with the host's PID namespace (docker --pid=host) so NVML's PIDs "
            "match; figures that need NVML are n/a")


@_summary("never-held")
def _never_held() -> str:
    return "the target never held GPU memory"


@_summary("nvml-only-grew")
def _nvml_only_grew(pid: int, device: int, first_bytes: int, last_bytes: int) -> str:
    """A process without PyTorch's allocator whose memory grew."""
    return (f"Process {pid} on GPU {device} grew from {fb(first_bytes)} when first seen to {fb(last_bytes)}, "
            f"outside PyTorch (no PyTorch allocator was seen in it).")


# -- the target's children (child_processes.py) -----------------------------------------------

def _short_command(cmdline: list[str] | None, limit: int = 60) -> str:
    """A command line on one short line: `python -c` programs carry newlines."""
    text = " ".join(" ".join(cmdline or []).split()) or "?"
    return text if len(text) <= limit else text[:limit - 1] + "…"


@_summary("orphan-process")
def _orphan_process(pid: int, cmdline: list[str] | None, total_bytes: int) -> str:
    return (f"Process {pid} ({_short_command(cmdline)}), started by the target, still holds "
            f"{fb(total_bytes)} after the target exited.")


@_summary("child-contexts")
def _child_contexts(count: int, workers: bool, parent: int, device: int, each_bytes: int, most: int,
                    at_once_bytes: int, lines: list[str]) -> str:
    """Children of `parent` with contexts of their own (`workers`: DataLoader workers; `lines`: where
    CUDA started in them, those the finding names)."""
    what = "DataLoader workers" if workers else "child processes"
    summary = (f"{count} {what} of process {parent} each created a CUDA context of their own on "
               f"GPU {device}, about {fb(each_bytes)} each: up to {most} at once, holding {fb(at_once_bytes)} "
               f"together.")
    if lines:
        summary += f" CUDA started in them at {', '.join(lines)}."
    return summary
