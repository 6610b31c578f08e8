"""Holders named by the peak's probes, for when no copy of the process was searched. Pure.

By default the tool makes no copy of the process during the run: a fork of a CUDA process pauses it
longer than the 20 ms allowed (`run --max-pause`; forked.py). What the agent read of the program's
names at its new highs (the probe, on the main thread, within 8 ms: _agent/peak/peak.py) then names the
holders:
- of an accumulation a pause in the steps let go of (judgement row 13): the names that held the
  most at the pause's highest probe, or, when none held much, the name whose autograd graph chains
  the most operations of one kind (a running sum without .item(): one addition a batch);
- of a growth (rows 2, 2b) that no search saw held: the names whose tensors, or whose graph's chain,
  grew from one probe to a later one.
The probe reads the main thread's running functions, the main module's globals and one level of
their attributes and containers: a holder further down (a hook's closure, another thread's frame)
is not named here, and the words say that no search was made. Each holder is made in the shape of
the search's accumulations (accumulations.py), with `probed` set and its graph's chain (or,
in the recordings of 2026-11-25 that counted them, its graph's nodes).
"""
from __future__ import annotations

from .summaries import tell
from .summaries_peak import MAIN_THREAD, graph_words  # noqa: F401 (their words are summaries_peak.py's)
from .suspects import MAX_SUSPECTS, accumulation_suspect, declined
from ..contract import MIN_GROWTH_BYTES as MIN_BYTES  # a name must hold, or have grown by, this much

GRAPH_MARK = " (holds its autograd graph)"
LOCAL = "() local "
MIN_CHAIN = 8  # links of one operation a name's graph must repeat to be named as an accumulation
MIN_NODES = 64  # graph nodes, in recordings that counted them (2026-11-25's), for the same
GROWTH_SHARE = 0.5  # of what allocated memory grew between two probes, that one name's growth must be
CATEGORIES = ("kept-tensors", "temporaries")


def holders(probe: dict) -> list[dict]:
    """A probe's holders of kept tensors and temporaries, and of graphs, as accumulations."""
    rows: dict = {}  # each row once (a holder can be both among the biggest and the graphs)
    for key in (*CATEGORIES, "graph_holders"):
        for h in probe.get(key) or []:
            rows.setdefault(h[0], h)
    out: dict = {}  # by pattern: `x[*]` and `x[*] (holds its autograd graph)` are one holder
    for h in map(_holder, rows.values()):
        same = out.get(h["pattern"])
        if same is None:
            out[h["pattern"]] = h
        else:
            same["bytes"] += h["bytes"]
            same["count"] += h["count"]
            same["nodes"], same["chain"] = max(same["nodes"], h["nodes"]), max(same["chain"], h["chain"])
            if h["kind"] == "autograd-graph":
                same["kind"] = "autograd-graph"
    return list(out.values())


def _holder(h: list) -> dict:
    """[name, bytes, line, tensors, nodes, chain] as the search names it: `__main__.x[*]`,
    `thread 'MainThread': f() at file.py local x`."""
    name, size, line = h[0], h[1], h[2]
    tensors, nodes = (h[3], h[4]) if len(h) >= 5 else (1, 0)
    chain = h[5] if len(h) >= 6 else 0
    graph = name.endswith(GRAPH_MARK)
    name = name[:-len(GRAPH_MARK)] if graph else name
    if LOCAL in name:
        function, _, local = name.partition(LOCAL)
        pattern = f"{MAIN_THREAD}{function}(){' at ' + line.rsplit(':', 1)[0] if line else ''} local {local}"
        path = f"{MAIN_THREAD}{function}(){' at ' + line if line else ''} local {local}"
        kind, thread = "frame-local", ["MainThread"]
    else:
        local = name.removeprefix("global ")
        pattern = path = f"__main__.{local}"
        kind, thread = ("attribute" if "." in local.split("[")[0] else "global"), None
    if graph and (nodes or chain > 1):
        kind = "autograd-graph"
    return {"path": path, "pattern": pattern, "kind": kind, "count": tensors, "bytes": size,
            "sizes": [], "where": None, "thread": thread, "probed": True, "nodes": nodes, "chain": chain,
            "line": line}


def _accumulates(h: dict) -> bool:
    """A graph that repeats one operation (a running sum), or, in recordings that counted nodes, a big one."""
    return h["chain"] >= MIN_CHAIN or h["nodes"] >= MIN_NODES


def found(probe: dict) -> int:
    """What a probe found held: its temporaries and kept tensors, and the links of the graphs it read."""
    return (probe.get("temporaries_bytes", 0) + probe.get("kept-tensors_bytes", 0)
            + probe.get("graph_links", probe.get("graph_nodes", 0)))


def probe_of(agent, n: int) -> dict | None:
    """The probe of capture n that found the most (a capture can have two: one as it was asked, one
    once a call's result was named; _agent/peak/peak.py), or None."""
    return max((p for p in agent.root.get("peak_probes", []) if p["n"] == n), key=found, default=None)


def probes_of(agent, torch_index: int, paused: bool | None = None) -> list[tuple[dict, dict]]:
    """(capture, probe) of this device, in time order, each capture's probe that found the most; only
    the captures in a pause when `paused`."""
    made = ((c, probe_of(agent, c["n"])) for c in agent.root.get("peaks", [])
            if c["device"] == torch_index and (paused is None or c["paused"] == paused))
    return sorted(((c, p) for c, p in made if p is not None and "error" not in p), key=lambda cp: cp[0]["t"])


def phase_holders(agent, torch_index: int, rise: int) -> tuple[list[dict], dict | None]:
    """What the names held in a pause in the steps, over all its probes: the holders of at least a
    quarter of the pause's rise, each as the probe that saw it hold the most found it, many alike
    tensors (what a pause gathers) before single ones, then biggest first; else the one whose graph
    chains the most operations of one kind at the highest probe (MIN_CHAIN; in older recordings, the
    most nodes). A pause that gathers pieces and then joins them holds either, for as long, so the
    highest probe alone named the one or the other by when it fell (peak_single_cat, H200). With
    the figures (`meta`) of the probe that found the first, or ([], None) when no probe was made in a
    pause."""
    made = probes_of(agent, torch_index, paused=True)
    if not made:
        return [], None
    best: dict = {}  # pattern -> (holder, capture, probe) where it held the most
    least = max(MIN_BYTES, rise // 4)
    for capture, probe in made:
        for h in holders(probe):
            known = best.get(h["pattern"])
            if h["bytes"] >= least and (known is None or h["bytes"] > known[0]["bytes"]):
                best[h["pattern"]] = (h, capture, probe)
    if best:
        chosen = sorted(best.values(), key=lambda hcp: (hcp[0]["count"] <= 1, -hcp[0]["bytes"], hcp[1]["t"]))
        return [h for h, _, _ in chosen], _meta(chosen[0][1], chosen[0][2])
    capture, probe = max(made, key=lambda cp: (cp[0]["allocated"] or 0, cp[0]["t"]))
    graph = longest_graph(holders(probe))
    return ([graph] if graph is not None else []), _meta(capture, probe)


def growth_holders(agent, torch_index: int) -> tuple[list[dict], dict | None]:
    """The names whose tensors grew from the first probe that saw them to the last by MIN_BYTES and by
    half of what allocated memory grew between those two moments, or whose graph's chain grew by
    MIN_CHAIN links (MIN_NODES nodes in older recordings): most grown first, each with its growth
    (`grew_bytes`, `grew_chain`, `grew_nodes`, `first_t`). ([], None)
    without two probes."""
    made = probes_of(agent, torch_index)
    if len(made) < 2:
        return [], None
    first: dict = {}
    last: dict = {}
    for capture, probe in made:
        for h in holders(probe):
            first.setdefault(h["pattern"], (capture, h))
            last[h["pattern"]] = (capture, h, probe)
    out = []
    for pattern, (capture, h, _) in last.items():
        c0, h0 = first[pattern]
        if c0 is capture:
            continue
        grew, nodes, chain = h["bytes"] - h0["bytes"], h["nodes"] - h0["nodes"], h["chain"] - h0["chain"]
        allocated = (capture["allocated"] or 0) - (c0["allocated"] or 0)
        graph = h["kind"] == "autograd-graph" and (nodes >= MIN_NODES or chain >= MIN_CHAIN)
        if grew >= max(MIN_BYTES, allocated * GROWTH_SHARE) or graph:
            out.append({**h, "grew_bytes": grew, "grew_nodes": nodes, "grew_chain": chain, "first_t": c0["t"],
                        "first_step": c0["step"]})
    if not out:
        return [], None
    out.sort(key=lambda h: (-h["grew_bytes"], -h["grew_chain"], -h["grew_nodes"]))
    capture, _, probe = last[out[0]["pattern"]]
    return out, _meta(capture, probe)


def growth_suspects(searched: dict, agent, torch_index: int, released: bool) -> tuple[list[dict], dict] | None:
    """A growth leak's suspects from the probes, and the finding's root_cause then, when no search saw
    the growth held: none was made during the run (the pause limit), or only the one at exit, after
    the memory was let go of (`released`). None otherwise, or when the probes named nothing."""
    at_exit = searched["searched"] and searched["when"] == "exit"
    if searched["searched"] and not (released and at_exit):
        return None
    grew, meta = growth_holders(agent, torch_index)
    if meta is None:
        return None
    if at_exit:
        why = declined(agent.root, "growth")
        cause = {"searched": False, "probed": meta, "exit_search_t": searched["t"],
                 "why_not": tell("exit-search-late", declined=why)}
    else:
        cause = {**searched, "probed": meta}
    return [suspect(a, released=released) for a in grew[:MAX_SUSPECTS]], cause


def _meta(capture: dict, probe: dict) -> dict:
    return {"probed": True, "t": capture["t"], "step": capture["step"], "elapsed_s": probe["elapsed_s"],
            "stopped": probe.get("stopped"), "graph_links": probe.get("graph_links", probe.get("graph_nodes"))}


def longest_graph(found: list[dict]) -> dict | None:
    """Of a probe's holders, the one whose graph chains the most operations of one kind (MIN_CHAIN; in
    older recordings, the most nodes), or None."""
    return min((h for h in found if _accumulates(h)), key=lambda h: (-h["chain"], -h["nodes"]), default=None)


def summary(a: dict) -> str:
    """A probed holder in words: what it held, and how that was read (summaries_peak.py words it)."""
    return tell("probed-holder", holder=a)


def suspect(a: dict, phase: bool = False, released: bool = False) -> dict:
    """A suspect made of a probed holder: the search's accumulation's, in the probe's words (no
    allocating line: the probe reads names, not allocations)."""
    made = accumulation_suspect(a, phase=phase, released=released)
    made["summary"] = summary(a)
    return made
