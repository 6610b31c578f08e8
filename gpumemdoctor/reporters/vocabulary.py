"""The words the terminal report and the HTML page share, so that both say the same thing: what each
verdict means (and its style in the terminal), what decided a finding, how the parts of a peak are
called and placed, the time to full, the suspects' heading. Strings only: drawing them is each
reporter's own."""
from __future__ import annotations

from ..diagnosis.findings import Diagnosis, PeakComposition
from ..diagnosis.words import gave_up_text
from ..units import format_bytes as fb
from ..units import full_words

# -- verdicts and findings ---------------------------------------------------------------

VERDICT_STYLE = {"clean": "bold green", "leak": "bold red", "out-of-memory": "bold red",
                 "allocator-cache": "bold yellow", "pending-stream": "bold yellow", "garbage-cycle": "bold red",
                 "non-torch": "bold red", "child-contexts": "bold yellow", "stray-context": "bold yellow",
                 "unknown": "bold magenta"}
VERDICT_MEANING = {
    "clean": "nothing grew and nothing unexpected is held",
    "leak": "the program keeps adding tensors it never lets go",
    "out-of-memory": "an allocation did not fit on the GPU",
    "allocator-cache": "freed tensors' memory is kept by PyTorch's cache",
    "pending-stream": "freed memory is held for unfinished stream work",
    "garbage-cycle": "tensors are held by reference cycles until gc runs",
    "non-torch": "memory outside PyTorch's allocator grew or is held",
    "child-contexts": "child processes hold CUDA contexts they should not need",
    "stray-context": "a process holds a CUDA context on a GPU it does not work on",
    "unknown": "memory was held, and the process ended before it could be told why",
}
DECIDED_BY = {
    "growth": "seen growing over the run",
    "structure": "decided by what was held at exit: the run was too short to see growth",
    "unheld": "decided by what no Python object holds: the run was too short to see growth",
    "out-of-memory": "decided at the out-of-memory error",
    "gc-at-exit": "found by gc.collect() at exit",
    "gc-during-run": "found by the garbage collector's own runs",
    "collector-disabled": "found by gc.collect() at exit, with the garbage collector disabled",
    "end-not-seen": "the process ended before its exit probes ran",
    "phases": "seen growing in steps, one at each pause in the loop (an evaluation, a validation)",
}


def time_to_full_text(f) -> str:
    """'At the end of the run (41.2 s), GPU 0 had 38.2 GiB free: at 35.0 MiB/s it would have been
    full in about 19 minutes.' for a finding of growth whose evidence has the time to full
    (diagnosis/headroom.py); '' for the others."""
    e = f.evidence
    if e.get("time_to_full_s") is None or e.get("free_bytes") is None or e.get("rate_bytes_per_s") is None:
        return ""
    at = f" ({e['free_t']:.1f} s)" if e.get("free_t") is not None else ""
    return (f"At the end of the run{at}, GPU {f.device} had {fb(e['free_bytes'])} free: "
            f"{full_words(e['rate_bytes_per_s'], e['time_to_full_s'], f'GPU {f.device}', ended=True)}.")


def suspects_heading(searched) -> str:
    """The heading over a finding's suspects, with when the search ran and how it ended ("Suspects
    (searched at exit, 0.07 s)"); `searched` is the finding's `root_cause` evidence."""
    head = "Suspects"
    if isinstance(searched, dict) and searched.get("probed"):  # the probes named them (probed.py)
        p = searched["probed"]
        at = f"step {p['step']}, {p['t']:.1f} s" if p.get("step") else f"{p['t']:.1f} s"
        head += f" (named by the probe of the program's names at {at}, {p['elapsed_s'] * 1000:.1f} ms, not by a search)"
    elif isinstance(searched, dict) and searched.get("searched"):
        when = "at exit" if searched.get("when") == "exit" else f"at step {searched.get('step')}"
        head += f" (searched {when}, {searched.get('elapsed_s', 0):.2f} s"
        head += f"; {gave_up_text(searched['gave_up'])})" if searched.get("gave_up") else ")"
    return head


def none_looked_for(f) -> str | None:
    """Why a leak's or live-at-exit's holders were neither searched for nor probed, or None."""
    searched = f.evidence.get("root_cause")
    if (f.kind in ("leak", "live-at-exit") and isinstance(searched, dict) and not searched.get("searched")
            and not searched.get("probed")):
        return str(searched.get("why_not"))
    return None


# -- the breakdown ------------------------------------------------------------------------

# Where NCCL's group was up before the first reading, its buffers of that moment may be in the context.
AFTER_NCCL_WORDS = ("when NCCL's group was already set up: it may hold NCCL's buffers, if "
                    "init_process_group(device_id=...) or a collective made them by then")


def nccl_words(env: dict | None) -> str:
    """The NCCL variables that sized its memory, as the process had them."""
    if not env:
        return "NCCL's defaults"
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items()))


# -- peaks --------------------------------------------------------------------------------

# What each category of a peak is called where it is drawn (PEAK_CATEGORIES' order is the drawing's).
PEAK_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer-state": "optimizer state",
               "activations": "activations", "gathered": "gathered, then freed",
               "graphs-kept": "graphs kept", "temporaries": "temporaries", "kept-tensors": "kept tensors",
               "unclassified": "unclassified", "request": "asked for at the error", "graph-pools": "CUDA graphs' pools", "fragmentation": "fragmentation", "cache": "allocator cache",
               "outside-pytorch": "outside PyTorch", "context": "CUDA context"}
# PyTorch's allocated peak counter is said to be above a peak's moment from this much: a few MiB are
# the moment's own small tensors come and gone.
ALLOCATED_PEAK_NOTE_BYTES = 16 << 20


def peak_label(category: str) -> str:
    return PEAK_LABELS.get(category, category)


def peaks_text(diagnosis: Diagnosis) -> str:
    """'NVML 2.53 GiB at 8.9 s, allocated 1.78 GiB, reserved 1.81 GiB'."""
    p = diagnosis.peaks
    parts = []
    if p.get("nvml_bytes") is not None:
        at = f" at {p['nvml_t']:.1f} s" if p.get("nvml_t") is not None else ""
        on = f" on {p['nvml_host']}" if p.get("nvml_host") else ""
        parts.append(f"NVML {fb(p['nvml_bytes'])}{at}{on}")
    for key in ("allocated", "reserved"):
        if p.get(f"{key}_bytes") is not None:
            parts.append(f"{key} {fb(p[f'{key}_bytes'])}")
    return ", ".join(parts)


def peak_order(compositions: list[PeakComposition]) -> list[PeakComposition]:
    """The compositions, the largest peak first (then by host, PID and GPU)."""
    return sorted(compositions, key=PeakComposition.rank)


def shown_parts(c: PeakComposition) -> list:
    """The parts drawn, in PEAK_CATEGORIES' order as the diagnosis gave them: none of 0 bytes but the context."""
    return [p for p in c.parts if p.bytes or p.category == "context"]


def peak_where(c: PeakComposition, with_host: bool = False) -> str:
    """'process 123, GPU 0, at 8.9 s, step 412, in a pause in the steps'."""
    out = (f"{c.host or '?'}: " if with_host else "") + f"process {c.pid}, GPU {or_dash(c.device)}"
    if c.t is not None:
        out += f", at {c.t:.1f} s"
    if c.step:  # (a program that marks no steps is at step 0 all along: no step to name)
        out += f", step {c.step}"
    return out + (", in a pause in the steps" if c.in_pause else "")


def holder_text(h: dict) -> str:
    """A holder: 'model.layers 512 MiB, train.py:40' (the line where it is known)."""
    line = f", {h['line']}" if h.get("line") else ""
    return f"{h.get('name')} {fb(h.get('bytes'))}{line}"


def allocated_peak_note(c: PeakComposition) -> str | None:
    """PyTorch's allocated peak counter above the allocated memory of the moment, said as such when
    it is by ALLOCATED_PEAK_NOTE_BYTES or more."""
    if c.allocated_peak_bytes is None or c.allocated_peak_bytes < c.allocated_bytes + ALLOCATED_PEAK_NOTE_BYTES:
        return None
    return (f"PyTorch's allocated peak reached {fb(c.allocated_peak_bytes)} by then, "
            f"{fb(c.allocated_peak_bytes - c.allocated_bytes)} above this moment, at a moment of its own "
            "that this reading did not see (the counter is never reset: any before this one)")


def share(part: int, total: int) -> str:
    return f"{part / total * 100:.0f}%" if total else "-"


def or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
