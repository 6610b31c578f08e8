"""The suspects' words: each suspect's summary and why a search was not made or found nothing
(suspects.py decides them). Pure.

The same registry as summaries.py's (summaries_registry.py): each sentence a registered function, its
keyword arguments the facts suspects.py decided; `tell(name, **facts)` makes it. `WHY_TEXT` and
`unheld_text` are suspects.py's too (it names them as before).
"""
from __future__ import annotations

import os

from .stacks import at as _at
from .summaries_registry import summary as _summary
from .words import alike
from ..units import format_bytes as fb

# What the search says of blocks without a holder, by its reason (the agent's search.WHY).
WHY_TEXT = {
    "no-python-object": "that no Python object holds",
    "unreachable": "held by an object that nothing the program reaches refers to",
    "not-reached": "that the search did not reach within its budget",
    "cublas-workspace": "that cuBLAS keeps as its workspaces",
}


def unheld_text(why: list | None) -> str:
    """What the search says of blocks without a holder, from its biggest reason."""
    if not why:
        return "held by no tensor the search reached"
    reason, _, _, top = why[0]
    text = WHY_TEXT[reason]
    if reason == "unreachable" and top:
        text = f"held by a {top} that nothing the program reaches refers to"
    return text


def _more_like_it(count: int) -> str:
    return f" and {count - 1} more like it" if count > 1 else ""


# -- why there was no search ------------------------------------------------------------------

@_summary("leak-search-why-not")
def _leak_search_why_not(reason: str, error: str | None = None, declined: str | None = None) -> str:
    """Why a leak's device had no search: `reason` "unseen", "history-failed" (`error`),
    "declined" (`declined`: why the growth search was not made) or "ended"."""
    if reason == "unseen":
        return ("growth was not seen while the program ran (the verdict is judged on the whole run "
                "afterwards); run again with --trace on to record allocation stacks from the start")
    if reason == "history-failed":
        return f"allocation history could not be turned on ({error})"
    if reason == "declined":
        return (f"the growth search during the run was not made ({declined}), and the "
                f"exit search found no new memory held")
    return "the program ended before the holder search ran"


@_summary("live-search-why-not")
def _live_search_why_not(when: str, declined: str | None, searched_any: bool) -> str:
    """Why no search over all live memory was made at `when` ("exit" or "oom")."""
    why = ("the program ended before the exit search ran, or the recording predates it" if when == "exit"
           else "no search was made at the out-of-memory error")
    if when == "oom" and declined is not None:
        why = f"the search at the out-of-memory error was not made: {declined}"
    if when == "exit" and not searched_any:
        why = ("less than 64 MiB of tensors was alive at exit and no growth was seen, so no search "
               "was made; run again with --trace on for allocation stacks")
    return why


# Why no copy of the process was searched at a pause's height, where the search says nothing.
NO_PAUSE_SEARCH = "no search was made at a pause's height"


@_summary("phase-search-why-not")
def _phase_search_why_not(declined: str | None) -> str:
    """Why no search was made at a pause's height."""
    if declined is not None:
        return f"the search at the pause's height was not made: {declined}"
    return NO_PAUSE_SEARCH


@_summary("phase-search-found-less")
def _phase_search_found_less(after_s: float | None) -> str:
    """A search (made during the pause, `after_s` after its first sample, or outside it: None) that
    found less held than the pause's probe."""
    when = f" made {after_s * 1000:.0f} ms after the pause's first sample" if after_s is not None else ""
    return f"the search{when} found less held"


@_summary("phase-search-found-nothing")
def _phase_search_found_nothing(after_s: float) -> str:
    """A search made during the pause (`after_s` after its first sample) that found nothing it let go of."""
    return f"the search made {after_s * 1000:.0f} ms after the pause's first sample found nothing that held it"


# -- the suspects ---------------------------------------------------------------------------

@_summary("allocation-suspect")
def _allocation_suspect(bytes: int, count: int, where: list | None, threads: list | None,
                        holder: dict | None, unheld_bytes: int | None, unheld_why: list | None) -> str:
    """A searched group: its allocations, where and in which threads, and who holds them."""
    parts = [f"{fb(bytes)} in {count} allocation{'s' if count != 1 else ''}"]
    parts.append(f"at {_at(where)}" if where else
                 "(no Python stack: allocated before recording began, or by PyTorch's C++ code)")
    if threads:
        parts.append(f"in thread {', '.join(threads)}")
    summary = " ".join(parts)
    if holder:
        summary += f"; held by {holder['path']}" + _more_like_it(holder["count"])
    elif unheld_bytes:
        summary += "; " + unheld_text(unheld_why).replace("that ", "", 1)
    return summary


@_summary("holder-suspect")
def _holder_suspect(holder: dict) -> str:
    """One holder of a group without allocation stacks."""
    h = holder
    return f"{fb(h['bytes'])} in {h['count']} tensor{'s' if h['count'] != 1 else ''} held by {h['path']}" \
        + _more_like_it(h["count"])


@_summary("unheld-bytes-suspect")
def _unheld_bytes_suspect(bytes: int, why: list | None) -> str:
    """A group's blocks without a holder."""
    return f"{fb(bytes)} {unheld_text(why)}"


@_summary("garbage-suspect")
def _garbage_suspect(tensor: dict, where: list | None) -> str:
    """Tensors that the garbage collector freed: who held them, in which cycle, allocated where."""
    t = tensor
    return (f"{fb(t['bytes'])} in {t['count']} tensor{'s' if t['count'] != 1 else ''} held by "
            f"{t['holder']}" + (f", in the cycle {t['cycle']}" if t["cycle"] else "")
            + (f"; allocated at {_at(where)}" if where else ""))


@_summary("thread-suspect")
def _thread_suspect(thread: dict, series: str, delta: int, overlapping: list[str]) -> str:
    """A thread that raised `series` ("non_torch" or "allocated") by `delta` while it ran."""
    th = thread
    what = "memory outside PyTorch" if series == "non_torch" else "live PyTorch tensors"
    summary = (f"thread {th['name']!r} raised {what} by {fb(delta)} while it ran "
               f"({th['t'] - th['t0']:.2f} s, ended at {th['t']:.1f} s)")
    if th["entry"]:
        summary += f", running {os.path.basename(th['entry'][0])} {th['entry'][1]}()"
    if overlapping:
        summary += f"; it ran alongside {', '.join(overlapping[:3])}, whose allocations are counted too"
    return summary


@_summary("accumulation-suspect")
def _accumulation_suspect(accumulation: dict) -> str:
    """A held accumulation: how many alike, who holds them, allocated where, and CUDA graphs' pools."""
    a = accumulation
    summary = f"{fb(a['bytes'])} in {alike(a)} held by {a['path']}" + _more_like_it(a["count"])
    if a["where"]:
        summary += f"; allocated at {_at(a['where'])}"
    if a["thread"]:
        summary += f" in thread {', '.join(a['thread'])}"
    if a.get("graph_pool_bytes"):
        summary += (f"; {fb(a['graph_pool_bytes'])} of it the private memory pools of the CUDA graphs "
                    f"{a['pattern']} keeps, held by the graphs")
    return summary


@_summary("unheld-suspect")
def _unheld_suspect(unheld: dict) -> str:
    """Alike allocations that nothing in Python holds."""
    u = unheld
    where = f" at {_at(u['where'])}" if u["where"] else ""
    why = u.get("why")
    return f"{fb(u['bytes'])} in {alike(u)}{where} {unheld_text(why) if why else 'that no Python object holds'}"
