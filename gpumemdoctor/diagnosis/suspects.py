"""Suspects: from the agent's searches (and its thread and garbage records) to the *suspects* of
each finding, with which search it was or why there was none. Pure.

A suspect says where the memory was allocated, who holds it, which thread, and the remedy at
that line (remedies.py). The records were checked when they were read (`records.py`). What many
alike tensors in a search are is read in accumulations.py, the program's line in a stack in
stacks.py.
"""
from __future__ import annotations

from . import remedies, stacks
from .accumulations import DIRECT_SHARE, GRAPH_PART, accumulations
from .words import gave_up_text  # noqa: F401 (gave_up_text: words.py's, named here as before)
from .stacks import at, on_device, user_line
from .summaries import tell
from .summaries_suspects import WHY_TEXT, unheld_text  # noqa: F401 (the suspects' words, named here as before)
from ..contract import GRAPH_POOL_LABEL
from ..units import MIB

THREAD_MIN_BYTES = 1 * MIB  # a thread that changed memory by less is not named
MAX_SUSPECTS = 5


def leak_suspects(root: dict, torch_index: int, released: bool = False) -> tuple[list[dict], dict]:
    """Suspects of a leak on one device, and what the search was (or why there was none).
    `released`: the growth was let go of after the loop (retention.released), so a function
    that held it has returned by now, and its remedy says what to do inside the loop."""
    found = [i for i in root["investigations"] if any(on_device(g, torch_index, True) for g in i["groups"])]
    if not found:
        return [], {"searched": False, "why_not": _why_not(root, torch_index)}
    # The search that found holders for the most of the new memory: at exit, unless the program
    # had already let go of what it held (a function that returned, a cycle that only the
    # collector frees: the search during the run saw who held it).
    chosen = max(found, key=lambda i: (_held_on(i, torch_index), _bytes_on(i, torch_index), i["when"] == "exit"))
    groups = [g for g in chosen["groups"] if on_device(g, torch_index, True)]
    # A leak repeats: one-off allocations (this step's batch, gradients) are not suspects.
    repeated = [g for g in groups if g["count"] >= 2] or groups[:1]
    # What something holds first: the leak is what the program keeps (unheld blocks stay, after).
    repeated.sort(key=lambda g: (-sum(h["bytes"] for h in g["holders"]), -g["bytes"]))
    repeated = [g if g["frames"] else stacks.latest_stack(g, root, torch_index) for g in repeated]
    if chosen["trace"]:  # with stacks recorded, stackless blocks are PyTorch's own (gradients)...
        # ... or the same leak's, allocated after --trace auto's window closed: held the same way
        repeated = _with_later_allocations(repeated)
        repeated = [g for g in repeated if g["frames"]] or repeated
    suspects = [_allocation_suspect(g, released) for g in repeated]
    meta = {"searched": True, "when": chosen["when"], "step": chosen["step"], "t": chosen["t"],
            "allocation_stacks": chosen["trace"], "source": chosen["source"],
            "new_bytes": chosen["candidate_bytes"], "new_allocations": chosen["candidate_count"],
            "objects_visited": chosen["visited"], "gave_up": chosen["gave_up"],
            "elapsed_s": chosen["elapsed_s"]}
    return suspects[:MAX_SUSPECTS], meta


def _with_later_allocations(groups: list[dict]) -> list[dict]:
    """Blocks without a stack held like the blocks of a group with one (a holder pattern that
    repeats there) are the same leak's later allocations, made once the allocation history had
    stopped: counted with it. What else the stackless groups hold (this step's batch, gradients,
    blocks nothing holds) stays theirs. Biggest held first again."""
    framed: dict = {}  # holder pattern -> the first group with a stack that holds blocks that way
    for g in groups:
        if g["frames"]:
            for h in g["holders"]:
                if h["count"] >= 2:
                    framed.setdefault(h["pattern"], g)
    if not framed:
        return groups
    out, merged = [], {}
    for g in groups:
        if g["frames"]:
            out.append(g)
            continue
        left = {**g, "holders": []}
        for h in g["holders"]:
            target = framed.get(h["pattern"])
            if target is None:
                left["holders"].append(h)
                continue
            into = merged.get(id(target))
            if into is None:
                into = merged[id(target)] = {**target, "holders": [dict(x) for x in target["holders"]]}
            into["bytes"] += h["bytes"]
            into["count"] += h["count"]
            left["bytes"] -= h["bytes"]
            left["count"] -= h["count"]
            same = next(x for x in into["holders"] if x["pattern"] == h["pattern"])
            same["count"] += h["count"]
            same["bytes"] += h["bytes"]
            same["sizes"] = _add_sizes(same.get("sizes"), h.get("sizes"))
        if left["count"] > 0:
            out.append(left)
    out = [merged.get(id(g), g) for g in out]
    out.sort(key=lambda g: (-sum(h["bytes"] for h in g["holders"]), -g["bytes"]))
    return out


def _add_sizes(a: list | None, b: list | None) -> list | None:
    """Two holders' most common block sizes, added: [[bytes, count], ...], most common first."""
    if not a and not b:
        return a
    counts: dict = {}
    for size, n in (a or []) + (b or []):
        counts[size] = counts.get(size, 0) + n
    return sorted(([size, n] for size, n in counts.items()), key=lambda p: -p[1])[:3]


def _held_on(investigation: dict, torch_index: int) -> int:
    return sum(h["bytes"] for g in investigation["groups"] if on_device(g, torch_index, True) for h in g["holders"])


def _bytes_on(investigation: dict, torch_index: int) -> int:
    return sum(g["bytes"] for g in investigation["groups"] if on_device(g, torch_index, True))


def _why_not(root: dict, torch_index: int) -> str:
    failed = next((t for t in root["traces"] if not t["ok"]), None)
    if not any(s["device"] == torch_index for s in root["suspicions"]):
        return tell("leak-search-why-not", reason="unseen")
    if failed is not None:
        return tell("leak-search-why-not", reason="history-failed", error=failed["error"])
    if declined(root, "growth") is not None:
        return tell("leak-search-why-not", reason="declined", declined=declined(root, "growth"))
    return tell("leak-search-why-not", reason="ended")


def declined(root: dict, when: str) -> str | None:
    """Why the last search asked for at `when` during the run was not made (a copy of the process
    would have paused it past the limit: the figures are in the words), or None."""
    found = [d for d in root.get("declined", ()) if d["when"] == when]
    return found[-1]["why"] if found else None


def _allocation_suspect(g: dict, released: bool = False) -> dict:
    stack = g["frames"]
    where = user_line(stack)
    holders = g["holders"]
    threads = g["thread"]
    summary = tell("allocation-suspect", bytes=g["bytes"], count=g["count"], where=where, threads=threads,
                   holder=holders[0] if holders else None, unheld_bytes=g["unheld_bytes"],
                   unheld_why=g.get("unheld_why"))
    return {"kind": "allocation", "bytes": g["bytes"], "count": g["count"], "where": where, "stack": stack,
            "thread": threads, "holders": holders, "unheld_bytes": g["unheld_bytes"], "summary": summary,
            "remedy": _remedy(holders[0] if holders else None, where, threads, g.get("unheld_why"), released)}


def _remedy(holder: dict | None, where: list | None, threads: list | None, why: list | None = None,
            released: bool = False, situation: str = "leak") -> str:
    """The remedies table's row for one holder (remedies.py). `released`: the memory was let go of
    after the loop (a function that held it returned), so a local's remedy is about the loop."""
    if holder is None:
        return remedies.unheld_remedy(why, where)
    return remedies.remedy(holder, where, "released" if released else situation,
                           bool(threads and any("(ended)" in t for t in threads)))


def live_suspects(root: dict, torch_index: int, when: str = "exit") -> tuple[list[dict], dict]:
    """Who holds the tensors alive on one device at exit (or at the first out-of-memory error,
    `when="oom"`: the search over all live memory made then), biggest first, and what the
    search was."""
    found = [i for i in root["investigations"] if i["when"] == when and i["all_live"]]
    if not found:
        why = tell("live-search-why-not", when=when, declined=declined(root, when) if when == "oom" else None,
                   searched_any=bool(root["investigations"]))
        return [], {"searched": False, "why_not": why}
    chosen = found[-1]
    suspects = []
    for g in (g for g in chosen["groups"] if on_device(g, torch_index)):
        if g["frames"]:
            s = _allocation_suspect(g)
            s["remedy"] = _live_remedy(g["holders"][0] if g["holders"] else None, s["where"], g.get("unheld_why"))
            suspects.append(s)
            continue
        # No allocation stacks: one suspect per holder, which is what the user can act on.
        for h in g["holders"]:
            summary = tell("holder-suspect", holder=h)
            suspects.append({"kind": "allocation", "bytes": h["bytes"], "count": h["count"], "where": None,
                             "stack": [], "thread": g["thread"], "holders": [h], "unheld_bytes": None,
                             "summary": summary, "remedy": _live_remedy(h, None)})
        if g["unheld_bytes"]:
            why = g.get("unheld_why")
            suspects.append({"kind": "allocation", "bytes": g["unheld_bytes"], "count": None, "where": None,
                             "stack": [], "thread": g["thread"], "holders": [], "unheld_bytes": g["unheld_bytes"],
                             "summary": tell("unheld-bytes-suspect", bytes=g["unheld_bytes"], why=why),
                             "remedy": _live_remedy(None, None, why)})
    # What someone holds comes first; blocks without a holder (mostly PyTorch's own buffers)
    # come last, and keep at least one line.
    suspects.sort(key=lambda s: -s["bytes"])
    _direct_first(suspects)
    held = [s for s in suspects if s["holders"]]
    unheld = [s for s in suspects if not s["holders"]]
    suspects = held[:MAX_SUSPECTS - (1 if unheld else 0)]
    suspects += unheld[:MAX_SUSPECTS - len(suspects)]
    meta = {"searched": True, "when": when, "step": chosen["step"], "t": chosen["t"],
            "allocation_stacks": chosen["trace"], "source": chosen["source"],
            "objects_visited": chosen["visited"], "gave_up": chosen["gave_up"],
            "elapsed_s": chosen["elapsed_s"]}
    return suspects, meta


def _direct_first(suspects: list[dict]) -> None:
    """Of two suspects about the same size (DIRECT_SHARE) where the larger is kept through the autograd
    graphs of what the other's holder holds (`outputs[*].grad_fn` beside `outputs[*]`: an evaluation's
    inputs beside its outputs), the one held directly comes first: its line is where the program
    makes what it keeps. Their sizes race at an out-of-memory error (one input more, or one less)."""
    for i in range(len(suspects) - 1):
        a, b = suspects[i], suspects[i + 1]
        if (a["holders"] and b["holders"] and a["holders"][0]["kind"] == "autograd-graph"
                and b["holders"][0]["kind"] != "autograd-graph" and b["bytes"] >= DIRECT_SHARE * a["bytes"]
                and a["holders"][0]["pattern"] == b["holders"][0]["pattern"] + GRAPH_PART):
            suspects[i], suspects[i + 1] = b, a


def _live_remedy(holder: dict | None, where: list | None, why: list | None = None) -> str:
    if holder is None:
        return remedies.unheld_remedy(why, where, live=True)
    if GRAPH_POOL_LABEL in holder["pattern"]:  # a CUDA graph holds its private pool: not a foreign array
        return remedies.FINDINGS["graph-pools-kept"].format(name=holder["pattern"].split(GRAPH_POOL_LABEL)[0],
                                                            at=f" at {at(where)}" if where else "")
    return remedies.remedy(holder, where, "live")


def garbage_suspects(root: dict) -> tuple[list[dict], dict]:
    g = root["garbage"]
    if g is None:
        return [], {}
    suspects = []
    for t in g["tensors"][:MAX_SUSPECTS]:
        where = user_line(t["frames"])
        holder = {"path": t["holder"], "pattern": t["holder"], "kind": "cycle", "count": t["count"],
                  "bytes": t["bytes"]}
        summary = tell("garbage-suspect", tensor=t, where=where)
        suspects.append({"kind": "garbage", "bytes": t["bytes"], "count": t["count"], "where": where,
                         "stack": t["frames"], "thread": None, "holders": [holder], "unheld_bytes": None,
                         "summary": summary, "remedy": _remedy(holder, where, None)})
    meta = {"objects_freed": g["objects"], "types": g["types"], "cuda_tensor_bytes": g["cuda_tensor_bytes"],
            "cuda_tensors": g["cuda_tensors"]}
    return suspects, meta


def thread_suspects(root: dict, torch_index: int, series: str) -> list[dict]:
    """Threads that changed `series` ("non_torch" or "allocated") on the device and ended."""
    runs = []
    for th in root["threads"]:
        before = next((r for r in th["d0"] if r[0] == torch_index), None)
        after = next((r for r in th["d1"] if r[0] == torch_index), None)
        if before is None or after is None:
            continue
        delta = _series(after, series) - _series(before, series) if None not in (
            _series(after, series), _series(before, series)) else None
        if delta is not None and delta >= THREAD_MIN_BYTES:
            runs.append((th, delta))
    out = []
    for th, delta in sorted(runs, key=lambda r: -r[1])[:MAX_SUSPECTS]:
        overlapping = [o["name"] for o, _ in runs if o is not th and o["t0"] < th["t"] and th["t0"] < o["t"]]
        summary = tell("thread-suspect", thread=th, series=series, delta=delta, overlapping=overlapping)
        # (The finding's own remedy says which tools give stacks outside PyTorch.)
        out.append({"kind": "thread", "bytes": delta, "count": None,
                    "where": [th["entry"][0], 0, th["entry"][1]] if th["entry"] else None, "stack": [],
                    "thread": [th["name"]], "holders": [], "unheld_bytes": None, "summary": summary,
                    "remedy": remedies.THREAD})
    return out


def _series(row: list, series: str) -> int | None:
    # [torch index, allocated, active, reserved, requested, nvml used, ...]
    if series == "allocated":
        return row[1]
    if row[5] is None or row[3] is None:
        return None
    return row[5] - row[3]


# -- accumulations as suspects (accumulations.py finds them) ---------------------------------

def accumulation_suspect(a: dict, phase: bool = False, released: bool = False) -> dict:
    """A suspect made of a held accumulation (`phase`: gathered during a pause, let go of at its end;
    `released`: held through the loop, let go of after it)."""
    holder = {"path": a["path"], "pattern": a["pattern"], "kind": a["kind"], "count": a["count"],
              "bytes": a["bytes"], "sizes": a["sizes"]}
    summary = tell("accumulation-suspect", accumulation=a)
    one = a["count"] == 1 and a["kind"] != "autograd-graph"  # one tensor gathers nothing
    remedy = _remedy(holder, a["where"], a["thread"], released=released,
                     situation=("phase-one" if one else "phase") if phase else "leak")
    if a.get("graph_pool_bytes"):  # CUDA graphs in the container hold their private pools (the search found them)
        remedy = remedies.FINDINGS["graph-pools-kept"].format(name=a["pattern"],
                                                               at=f" at {at(a['where'])}" if a["where"] else "")
    return {"kind": "allocation", "bytes": a["bytes"], "count": a["count"], "where": a["where"],
            "stack": [a["where"]] if a["where"] else [], "thread": a["thread"], "holders": [holder],
            "unheld_bytes": None, "summary": summary, "remedy": remedy}


def unheld_suspect(u: dict) -> dict:
    """A suspect made of alike allocations that nothing in Python holds."""
    why = u.get("why")
    summary = tell("unheld-suspect", unheld=u)
    remedy = remedies.unheld_remedy(why, u["where"], u.get("graph_grads"))
    return {"kind": "allocation", "bytes": u["bytes"], "count": u["count"], "where": u["where"],
            "stack": [u["where"]] if u["where"] else [], "thread": u["thread"], "holders": [],
            "unheld_bytes": u["bytes"], "summary": summary, "remedy": remedy}


def phase_accumulations(root: dict, torch_index: int, at_exit: list[dict]) -> tuple[list[dict], dict]:
    """The accumulations that a search at a pause's height found (when="phase", the biggest such
    search) and the exit search no longer did: what the pause let go of at its end."""
    found = [i for i in root["investigations"] if i["when"] == "phase"]
    if not found:
        why = declined(root, "phase")
        if why is not None:
            return [], {"searched": False, "declined": why, "why_not": tell("phase-search-why-not", declined=why)}
        return [], {"searched": False, "why_not": tell("phase-search-why-not", declined=None)}
    gone = {a["pattern"] for a in at_exit}
    best, chosen = [], found[-1]
    for i in found:
        held = [a for a in accumulations(i, torch_index)[0] if a["pattern"] not in gone]
        if sum(a["bytes"] for a in held) > sum(a["bytes"] for a in best):
            best, chosen = held, i
    meta = {"searched": True, "when": "phase", "step": chosen["step"], "t": chosen["t"],
            "allocation_stacks": chosen["trace"], "source": chosen["source"],
            "objects_visited": chosen["visited"], "gave_up": chosen["gave_up"],
            "elapsed_s": chosen["elapsed_s"]}
    return best, meta


def search_of(root: dict, when: str) -> dict | None:
    """The last search over all live memory made at `when` ("exit" or "oom")."""
    found = [i for i in root["investigations"] if i["when"] == when and i["all_live"] is not False]
    return found[-1] if found else None
