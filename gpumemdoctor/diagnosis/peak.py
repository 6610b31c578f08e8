"""What made the peak: one process's highest observed moment on one GPU, split into parts that add
up to it, and the findings where that peak could be lower. Pure: it reads the agent's `peak`
records (a capture at each new high of the process's memory) and their probes (_agent/peak/peak.py).

How each part is recognised:
- context: the breakdown's CUDA context (read at the first allocation);
- outside-pytorch: NVML's figure for the process, less the context and PyTorch's reserved memory;
- fragmentation: PyTorch's `inactive_split_bytes`, free memory inside split segments;
- cache: the rest of reserved memory not allocated;
- parameters, gradients, optimizer-state: the storages of every optimizer that stepped (its
  parameter groups, their .grad, its state), each counted once, at the same moment; parameters also
  of modules the probe found in the program's names;
- temporaries, kept-tensors: the probe, on the main thread just after the capture: what the
  locals of running functions hold, what the main module's globals hold;
- graphs-kept: what the holder search, made in a copy of the process during the same pause in the
  steps (an evaluation), found held through autograd graphs (holder kind `autograd-graph`): the
  search that found the most, at its own moment, which can be below the peak's;
- unclassified: the rest of the allocated memory, never guessed at (what the main thread was
  running says where it came from: inside backward(), activations and gradients being made); of it,
  cuBLAS's workspaces as measured at exit, where they were (they stay from a stream's first matrix
  product on, and are not read at the peak).
"""
from __future__ import annotations

import functools

from . import allocated_peak, cache_filled, fit, probed
from .peak_warnings import findings
from .findings import PEAK_CATEGORIES, Breakdown, Finding, PeakComposition, PeakPart
from .summaries import tell
from .summaries_peak import HOW, NO_CONTEXT, NO_PARAMETERS, NO_PROBE, READ_AT_EXIT
from .words import unclassified_told  # noqa: F401 (its words are words.py's; named here as before)
from ..units import MAX_SIZE_BYTES

MIN_HOLDER_BYTES = 64 << 10  # a holder smaller than this is not named (a scalar loss, a step count)
PROBE_PARTS = ("parameters", "temporaries", "kept-tensors")
BUSIER_BYTES = 256 << 20  # a capture with this much more memory in use than NVML's highest
BUSIER_SHARE = 0.10  # and this share of the highest tells what made the peak instead (_busiest)
ONE_MOMENT = 0.8  # of the highest's reserved memory, that PyTorch's allocated peak counter must reach
HIGHEST_CACHE_SHARE = 0.5  # of the highest's total, its cache
EARLIER_S = 1.0  # a probe made this long before a capture without one still tells its pause's graph



def compose(agent, torch_index: int, b: Breakdown, where: str) -> tuple[PeakComposition | None, list[Finding]]:
    """The composition of this process's highest capture on this device, and its findings."""
    captures = [c for c in agent.root.get("peaks", []) if c["device"] == torch_index]
    if not captures:
        return allocated_peak.compose(agent, torch_index, b, 0, _nvml_index(agent, torch_index), where) or (None, [])
    total = functools.partial(_total, context=b.context_bytes)
    best, highest = _busiest(captures, total)
    probe = probed.probe_of(agent, best["n"])
    split = _Split(best)
    _outside_allocated(split, agent, best, total(best), b.context_bytes)
    # Within the allocated memory: the optimizers' parts, then the graphs and the probe's, then the rest.
    _optimizers(split, best)
    _graphs(split, agent, torch_index, best)
    _probed(split, probe)
    if not best["optimizers"] and not (probe and probe.get("parameters_bytes")):
        split.notes.append(NO_PARAMETERS)
    _unclassified(split, agent, best, probe, b.cublas_workspace_bytes or 0)
    split.notes += _moment_notes(best, highest, len(captures), total)
    ordered = [split.parts[c] for c in PEAK_CATEGORIES if c in split.parts]
    if max(sum(p.bytes for p in ordered), total(best), total(highest or best)) > MAX_SIZE_BYTES:
        return None, []  # readings no GPU could give (a corrupt record): no peak to split
    composition = PeakComposition(
        pid=agent.pid, device=_nvml_index(agent, torch_index), torch_index=torch_index, t=best["t"],
        step=best["step"], total_bytes=sum(p.bytes for p in ordered), allocated_bytes=split.allocated,
        reserved_bytes=split.reserved, parts=ordered, allocated_peak_bytes=best["allocated_peak"],
        in_pause=best["paused"], where=best["where"], notes=split.notes,
        highest=None if highest is None else {"t": highest["t"], "total_bytes": total(highest),
                                              "cache_bytes": _cache(highest)})
    shown, found = _or_allocated_peak(agent, torch_index, b, where, composition, findings(composition, best, where))
    said = cache_filled.note(agent, shown)
    if said:
        shown.notes.append(said)
    return shown, found


# The composition at PyTorch's allocated peak (allocated_peak.py) is the one shown when it had this
# much more in use (all but the cache and fragmentation) than the highest reading's, or as much and
# this much less unclassified (a sample that saw a fast evaluation's graphs at their height, untold).
MORE_IN_USE_BYTES = 64 << 20


def _or_allocated_peak(agent, torch_index: int, b: Breakdown, where: str, composition: PeakComposition,
                       found: list[Finding]) -> tuple[PeakComposition, list[Finding]]:
    """The readings' composition, or the one at PyTorch's allocated peak where that moment, seen
    only by the allocator's events, had more in use (a step's activations, a fast evaluation)."""
    outside = composition.part("outside-pytorch")
    replayed = allocated_peak.compose(agent, torch_index, b, outside.bytes if outside else 0, composition.device,
                                      where)
    if replayed is not None and _told_more(replayed[0], composition):
        c = replayed[0]
        c.notes.append(tell("busiest-reading", in_use_bytes=_in_use(composition), total_bytes=composition.total_bytes,
                            t=composition.t))
        # NVML's highest reading, where it was higher than this moment, still ranks the process (peak_bytes).
        highest = composition.highest or {"t": composition.t, "total_bytes": composition.total_bytes,
                                          "cache_bytes": composition.bytes_of("cache")}
        if highest["total_bytes"] > c.total_bytes:
            c.highest = highest
            c.notes += [n for n in composition.notes if n.startswith("the reading with the most memory in use")]
        _optimizers_named(c, agent, torch_index)
        return replayed
    missed = allocated_peak.incomplete_note(agent, torch_index)
    if missed:
        composition.notes.append(missed)
    return composition, found


def _optimizers_named(c: PeakComposition, agent, torch_index: int) -> None:
    """The optimizers that hold the parameters, gradients and state of the split at the allocated
    peak (the events know the storages, not whose they are): as the capture nearest to it that read
    them says. Their figures are the capture's, read at another moment (the gradients of a whole
    step against a peak inside backward(), the state before the first step): one optimizer holds
    all of the part, so it gets the part's figure; several keep the capture's, said to be its own
    where they differ from the part's."""
    read = [cap for cap in agent.root.get("peaks", []) if cap["device"] == torch_index and cap["optimizers"]]
    if not read:
        return
    nearest = min(read, key=lambda cap: abs(cap["t"] - c.t))
    for category, _, column, label in OPTIMIZER_PARTS:
        part = c.part(category)
        if part is None or part.holders:
            continue
        holders = _optimizer_holders(nearest, column, label)
        then = sum(h["bytes"] for h in holders)
        if len(holders) == 1:
            holders[0]["bytes"] = part.bytes
        elif holders and abs(then - part.bytes) > max(part.bytes // 10, 1 << 20):
            c.notes.append(tell("optimizers-read-apart", category=category, t=nearest["t"], then_bytes=then))
        part.holders = holders


def _told_more(replayed: PeakComposition, composition: PeakComposition) -> bool:
    """Whether the split at the allocated peak had more in use than the readings' composition, or as
    much with less of it unclassified."""
    more = _in_use(replayed) - _in_use(composition)
    return more > MORE_IN_USE_BYTES or (more >= -MORE_IN_USE_BYTES and replayed.bytes_of("unclassified")
                                        + MORE_IN_USE_BYTES < composition.bytes_of("unclassified"))


def _in_use(c: PeakComposition) -> int:
    """All of a composition but the allocator's cache and fragmentation."""
    return c.total_bytes - sum(p.bytes for p in c.parts if p.category in ("cache", "fragmentation"))


class _Split:
    """One capture's parts as they are told, the notes on how, and the allocated memory not yet told."""

    def __init__(self, capture: dict):
        self.allocated = capture["allocated"] or 0
        self.reserved = max(capture["reserved"] or 0, self.allocated)
        self.left = self.allocated
        self.parts: dict[str, PeakPart] = {}
        self.notes: list[str] = []

    def add(self, category: str, size: int, holders: list | None = None, how: str | None = None) -> None:
        """A part that holds anything; the context's always (its 0 is a reading)."""
        if size > 0 or category == "context":
            self.parts[category] = PeakPart(category, size, how or HOW[category], holders or [])

    def take(self, category: str, size: int, holders: list | None = None) -> None:
        """A part of the allocated memory, cut to what is left of it."""
        size = min(size, self.left)
        self.left -= size
        self.add(category, size, holders)


def _total(capture: dict, context: int | None) -> int:
    """NVML's figure for the process; without one, the context and PyTorch's reserved memory."""
    return capture["nvml"] if capture["nvml"] else (context or 0) + (capture["reserved"] or 0)


def _outside_allocated(split: _Split, agent, capture: dict, peak_total: int, context: int | None) -> None:
    """The parts outside the allocated memory: the context, the memory outside PyTorch, and PyTorch's
    reserved memory that is not allocated (fragmentation, cache)."""
    ctx = min(context or 0, peak_total)
    if context is None:
        split.notes.append(NO_CONTEXT)
    split.add("context", ctx)
    outside = peak_total - ctx - split.reserved
    if capture["nvml"] and outside < 0:
        split.notes.append(tell("nvml-below-pytorch", nvml_bytes=peak_total, pytorch_bytes=ctx + split.reserved))
    split.add("outside-pytorch", max(0, outside), how=tell("outside-how", libraries=_libraries(agent)))
    free = split.reserved - split.allocated
    fragmented = min(capture["inactive_split"] or 0, free)
    # CUDA graphs' private pools: their free memory is the graphs', kept for their replays, not free pieces
    # of the program's segments (taken from the split memory first: a pool's segments hold its outputs).
    pools = min(graph_pool_free(agent, capture["device"]), free)
    from_split = min(pools, fragmented)
    split.add("graph-pools", pools)
    split.add("fragmentation", fragmented - from_split)
    split.add("cache", free - fragmented - (pools - from_split))


def graph_pool_free(agent, torch_index: int) -> int:
    """The free memory inside CUDA graphs' private pools on this device, as measured at exit
    (_agent/parts.graph_pools); 0 where none was captured or measured."""
    parts = (getattr(agent, "exit_info", None) or {}).get("parts") or {}
    return sum(reserved - allocated for index, _, reserved, allocated in parts.get("graph_pools") or []
               if index == torch_index)


# The optimizers' parts: category, the capture's key, its column in a capture's `optimizers` rows, the
# holder's words.
OPTIMIZER_PARTS = (("parameters", "parameters", 1, "{}'s parameter groups"),
                   ("gradients", "gradients", 2, "{}'s parameters' .grad"),
                   ("optimizer-state", "optimizer_state", 3, "{}.state"))


def _optimizers(split: _Split, capture: dict) -> None:
    """The stepped optimizers' parameters, gradients and state, each with its optimizers as holders."""
    for category, key, column, label in OPTIMIZER_PARTS:
        split.take(category, capture[key], _optimizer_holders(capture, column, label))


def _optimizer_holders(capture: dict, column: int, label: str) -> list[dict]:
    return [{"name": label.format(o[0]), "bytes": o[column], "line": None}
            for o in sorted(capture["optimizers"], key=lambda o: -o[column]) if o[column]]


def _graphs(split: _Split, agent, torch_index: int, capture: dict) -> None:
    """What a holder search in the capture's pause found held through autograd graphs."""
    graphs, holders, search = _graphs_from_search(agent, torch_index, capture)
    if not graphs:
        return
    split.take("graphs-kept", graphs, holders)
    if search["t"] < capture["t"] - 0.05:
        split.notes.append(tell("graphs-read-earlier", search_t=search["t"], before_s=capture["t"] - search["t"]))


def _probed(split: _Split, probe: dict | None) -> None:
    """The probe's parts (PROBE_PARTS): its modules' parameters join the optimizers'; or why there are none."""
    if probe is None:
        split.notes.append(NO_PROBE)
        return
    if "error" in probe:
        split.notes.append(tell("probe-failed", error=probe["error"]))
        return
    cut = False
    for category in PROBE_PARTS:
        found = probe.get(f"{category}_bytes", 0)
        size = min(found, split.left)
        cut = cut or size < found
        split.left -= size
        if size <= 0:
            continue
        holders = [{"name": h[0], "bytes": h[1], "line": h[2]} for h in probe.get(category, [])
                   if h[1] >= MIN_HOLDER_BYTES]
        prior = split.parts.get(category) if category == "parameters" else None
        if prior is not None:
            prior.bytes += size
            prior.holders = sorted(prior.holders + holders, key=lambda h: -h["bytes"])[:4]
        else:
            split.add(category, size, holders)
    if cut:
        split.notes.append(tell("probe-cut", elapsed_s=probe["elapsed_s"]))
    if probe.get("stopped"):
        read = probe.get("graph_links", probe.get("graph_nodes", 0))
        split.notes.append(tell("probe-stopped", stopped=probe["stopped"], read=read))


def _unclassified(split: _Split, agent, capture: dict, probe: dict | None, cublas: int) -> None:
    """The rest of the allocated memory, with what is known of it (_unclassified_how).
    cuBLAS's workspaces are allocated tensors that nothing in Python holds; their size is read only
    at exit (what clearing them frees), and they stay from a stream's first matrix product on.
    More than is left: the peak came before some of them were made (or they are not all there)."""
    cublas = cublas if cublas <= split.left else 0
    holders = [{"name": "cuBLAS workspaces at exit", "bytes": cublas, "line": None}] if cublas else []
    earlier = None if probe is not None else _earlier_probe(agent, capture)
    split.add("unclassified", split.left, holders,
              how=_unclassified_how(capture, cublas, split.left - cublas, probe, earlier))


def _moment_notes(best: dict, highest: dict | None, captures: int, total) -> list[str]:
    """Which reading this is: the busiest beside NVML's highest, the exit's, one of several."""
    notes = []
    if highest is not None:
        notes.append(tell("highest-reading", by_nvml=bool(highest["nvml"]), total_bytes=total(highest), t=highest["t"],
                          cache_bytes=_cache(highest), counter_bytes=highest["allocated_peak"] or 0,
                          seen_bytes=max(best["allocated"] or 0, best["allocated_peak"] or 0)))
    if best.get("inside") == "exit":
        notes.append(READ_AT_EXIT)
    if captures > 1:
        notes.append(tell("readings-at-highs", captures=captures, highest=highest is None))
    return notes


def _cache(capture: dict) -> int:
    """Reserved, neither allocated nor split: what the allocator keeps of memory freed."""
    allocated = capture["allocated"] or 0
    free = max(capture["reserved"] or 0, allocated) - allocated
    return free - min(capture["inactive_split"] or 0, free)


def _busiest(captures: list[dict], total) -> tuple[dict, dict | None]:
    """The capture whose parts tell what made the peak, and NVML's highest where that is another.
    The highest total, unless it was mostly (HIGHEST_CACHE_SHARE) the allocator's cache, another
    capture had more in use (all but the cache) by BUSIER_BYTES and BUSIER_SHARE of it, and the
    highest's cache was allocated memory once: PyTorch's allocated peak counter there covers
    ONE_MOMENT of its reserved memory. After an evaluation that freed its graphs, the next new high
    is mostly the cache they left (an H100's GPT-2 evaluation without no_grad: 17.2 GiB of 18.4); a
    cache that no moment filled (tensors of varying shapes, each size cached apart) is itself what
    made the peak."""
    highest = max(captures, key=total)
    busiest = max(captures, key=lambda c: total(c) - _cache(c))
    more = (total(busiest) - _cache(busiest)) - (total(highest) - _cache(highest))
    reserved = max(highest["reserved"] or 0, highest["allocated"] or 0)
    once = (highest["allocated_peak"] or 0) >= ONE_MOMENT * reserved
    mostly_cache = _cache(highest) >= HIGHEST_CACHE_SHARE * total(highest)
    if mostly_cache and once and more > max(BUSIER_BYTES, BUSIER_SHARE * total(highest)):
        return busiest, highest
    return highest, None


def _graphs_from_search(agent, torch_index: int, capture: dict) -> tuple[int, list, dict | None]:
    """What a holder search made in the capture's pause (same step count; a search at an
    evaluation's height or at an out-of-memory error) found held through autograd graphs on this
    device: bytes, holders, the search. The one that found the most."""
    best = (0, [], None)
    for search in agent.root.get("investigations", []):
        if search["when"] not in ("phase", "oom") or search["step"] != capture["step"] or search["t"] > capture["t"]:
            continue
        held: dict = {}
        oom = _oom_of(agent, search) if search["when"] == "oom" else None
        for group in search["groups"]:
            if group.get("device") not in (None, torch_index):
                continue
            frame = group["frames"][0] if group["frames"] else None
            line = f"{frame[0].rsplit('/', 1)[-1]}:{frame[1]}" if frame else None
            for h in group["holders"]:
                # (at an error in a step's forward, its locals' graphs are the step's activations: not kept)
                if h["kind"] == "autograd-graph" and not (oom is not None and fit.running_step(oom, h)):
                    entry = held.setdefault(h["path"], {"name": h["path"], "bytes": 0, "line": line})
                    entry["bytes"] += h["bytes"]
        total = sum(h["bytes"] for h in held.values())
        if total > best[0]:
            best = (total, sorted(held.values(), key=lambda h: -h["bytes"])[:4], search)
    return best


def _oom_of(agent, search: dict) -> dict | None:
    """The out-of-memory record an `oom` search was made for: the first error (only it is searched)."""
    ooms = agent.root.get("ooms", [])
    return ooms[0] if ooms else None


def _unclassified_how(capture: dict, cublas: int = 0, rest: int | None = None, probe: dict | None = None,
                      earlier: tuple[dict, dict] | None = None) -> str:
    """HOW's words, then what is known of the part: cuBLAS's workspaces as measured at exit, and where
    the main thread was when the rest was read, or the name whose autograd graph the probe found
    repeating one operation, or, with no probe at this moment, one made earlier in the same pause
    found (`earlier`: its capture and probe). Each after '; ', the terminal shows them."""
    how = functools.partial(tell, "unclassified-how", cublas=bool(cublas))
    if rest is not None and rest < MIN_HOLDER_BYTES:  # all of it the workspaces
        return how(read=None)
    if earlier is not None:
        graph = probed.longest_graph(probed.holders(earlier[1]))
        if graph is not None:
            return how(read="earlier-probe", after_s=capture["t"] - earlier[0]["t"], graph=graph)
    if not probe or "error" in probe:  # kept tensors, graphs and temporaries not told apart: no guess
        return how(read=None)
    inside = capture.get("inside")
    if inside == "backward":
        return how(read="backward")
    if inside == "optimizer step":
        own = (capture.get("parameters") or 0) + (capture.get("gradients") or 0) + (capture.get("optimizer_state") or 0)
        if rest is None or rest <= own:
            return how(read="optimizer-temporaries")
        return how(read="optimizer-beyond", own_bytes=own)
    graph = probed.longest_graph(probed.holders(probe))
    return how(read="graph", graph=graph) if graph is not None else how(read=None)


def _earlier_probe(agent, capture: dict) -> tuple[dict, dict] | None:
    """The latest probe made before this capture, within EARLIER_S, in the same pause in the steps
    (its capture and the probe), for a capture whose own probe was not made."""
    if not capture["paused"]:
        return None
    same = [(c, p) for c, p in probed.probes_of(agent, capture["device"], paused=True)
            if c["step"] == capture["step"] and capture["t"] - EARLIER_S <= c["t"] < capture["t"]]
    return same[-1] if same else None  # (in time order)


def _libraries(agent) -> list[str]:
    """The libraries with memory of their own in this process."""
    names = [r["name"] for r in agent.root.get("libraries", [])]
    if agent.root.get("groups"):
        names.append("NCCL (process groups)")
    return names


def _nvml_index(agent, torch_index: int) -> int | None:
    device = agent.device(torch_index)
    return device.nvml_index if device else None
