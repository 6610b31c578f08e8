"""Accumulations: how a leak looks when it could not be watched growing. In a search over all live
memory, many alike tensors reached the same way (one holder pattern such as `x[*]`, a traceback
chain, a hook's closure), and many alike allocations that no object the search reached holds. The
judgement weighs them (a leak at exit, an out-of-memory error's cause, what a pause gathered);
`suspects` makes suspects of them. Pure.
"""
from __future__ import annotations

from .stacks import on_device, user_line
from ..contract import GRAPH_POOL_LABEL

MIN_ALIKE = 8  # tensors held the same way (or allocations nobody holds) before they are "many"
GRAPH_PART = ".grad_fn (autograd graph)"  # the part of a holder pattern that an autograd graph adds
DIRECT_SHARE = 0.95  # of what is kept through a holder's graphs, that what it holds directly must be
# Paths through these are a model's own state, which is many alike tensors by design.
MODEL_STATE = ("._parameters[", "._buffers[", ".param_groups[", "[<Parameter>]", "._modules[*]._parameters")


def accumulations(investigation: dict | None, torch_index: int) -> tuple[list[dict], list[dict]]:
    """(held, unheld) accumulations on one device in a search over all live memory:
    at least MIN_ALIKE tensors reached the same way (one holder pattern such as
    `x[*]`, a traceback chain, a hook's closure), and at least MIN_ALIKE alike
    allocations that no object the search reached holds (with stacks: one
    allocating line; without: one size), biggest first."""
    if investigation is None:
        return [], []
    held: dict = {}  # holder pattern, less its graph's part -> the accumulation as it is gathered
    unheld = []
    for g in investigation["groups"]:
        if not on_device(g, torch_index):
            continue
        where = user_line(g["frames"])
        for h in g["holders"]:
            if not any(m in h["pattern"] for m in MODEL_STATE):
                _gather(held, g, h, where)
        alike = _unheld(g, where, investigation.get("graph_grads"))
        if alike is not None:
            unheld.append(alike)
    out = [_finished(a) for a in held.values() if a["count"] >= MIN_ALIKE]
    return sorted(out, key=lambda a: -a["bytes"]), sorted(unheld, key=lambda u: -u["bytes"])


def _gather(held: dict, g: dict, h: dict, where: list | None) -> None:
    """Add one holder pattern of a group to its accumulation."""
    # x[*] and the autograd graphs of x[*] are one accumulation: one container keeps both; so are x[*] and
    # the CUDA graphs in x[*] that hold their private pools (a graph, its static input and output).
    root = h["pattern"].split(GRAPH_PART)[0].split(GRAPH_POOL_LABEL)[0]
    a = held.setdefault(root, {"pattern": root, "path": h["path"].split(GRAPH_POOL_LABEL)[0], "kind": h["kind"],
                               "count": 0, "bytes": 0, "sizes": {}, "where": None,
                               "thread": g["thread"], "parts": {}, "lines": {}, "container": 0,
                               "graph_pool_bytes": 0})
    if GRAPH_POOL_LABEL in h["pattern"]:
        a["graph_pool_bytes"] += h["bytes"]
    if where is not None:
        # The line of its blocks that have stacks (--trace auto records them for a window;
        # the later blocks, held the same way, are the same leak's), the most bytes first.
        line = a["lines"].setdefault(tuple(where), [where, 0, 0])
        line[1] += h["bytes"]
        if GRAPH_PART not in h["pattern"]:
            line[2] += h["bytes"]  # held directly, not through the container's graphs
        if a["thread"] is None:
            a["thread"] = g["thread"]
    if GRAPH_PART not in h["pattern"]:
        a["container"] += h["count"]
        if a["kind"] == "autograd-graph":  # named by the container, not its graphs...
            a["graph"] = (a["path"], a["kind"])
            a["path"], a["kind"] = h["path"], h["kind"]
    elif a["container"] and "graph" not in a:
        a["graph"] = (h["path"], h["kind"])
    a["count"] += h["count"]
    a["bytes"] += h["bytes"]
    a["parts"][h["pattern"]] = a["parts"].get(h["pattern"], 0) + h["bytes"]
    for size, n in h.get("sizes") or []:
        a["sizes"][size] = a["sizes"].get(size, 0) + n


def _finished(a: dict) -> dict:
    """An accumulation gathered: named, placed at its line, its sizes and parts most first."""
    lines = a.pop("lines")
    graph = a.pop("graph", None)
    if a.pop("container") < 2 and graph is not None:
        # ... but one tensor that holds a graph (a running sum without .item()) is no container:
        # the chain its grad_fn keeps is the accumulation, named by its graph (a chain is a container).
        a["path"], a["kind"] = graph
    if lines:
        # The line with the most bytes; of lines about as big (DIRECT_SHARE), the one whose tensors the
        # container holds directly (an evaluation's outputs), not through their graphs (its inputs):
        # their sizes race at an out-of-memory error, and tie when the error comes between the two.
        top = max(line[1] for line in lines.values())
        near = [line for line in lines.values() if line[1] >= DIRECT_SHARE * top]
        a["where"] = max(near, key=lambda line: (line[2], line[1]))[0]
    a["sizes"] = sorted(([s, n] for s, n in a["sizes"].items()), key=lambda p: -p[1])[:3]
    a["parts"] = sorted(([p, n] for p, n in a["parts"].items()), key=lambda p: -p[1])
    return a


def _unheld(g: dict, where: list | None, graph_grads: int | None) -> dict | None:
    """A group's blocks without a holder, where at least MIN_ALIKE of them are alike."""
    sizes = g.get("unheld_sizes") or []
    count = g.get("unheld_count") or 0
    why = g.get("unheld_why")
    if why and why[0][0] == "not-reached":
        return None  # not evidence of anything: the search stopped before it got there
    # Without stacks every block is one group: only blocks of one size are alike.
    alike = count if g["frames"] else (sizes[0][1] if sizes else 0)
    if alike < MIN_ALIKE:
        return None
    return {"count": alike, "bytes": g["unheld_bytes"] if g["frames"] else sizes[0][0] * alike,
            "sizes": sizes, "where": where, "thread": g["thread"],
            "same_line": bool(g["frames"]), "why": g.get("unheld_why"), "graph_grads": graph_grads}
