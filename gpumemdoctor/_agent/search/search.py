"""The holder search: which allocator blocks are alive, and who holds each of them.

1. The blocks: PyTorch's allocator snapshot (or, without one, the storages of live tensors).
2. The anchors (anchors.py, one pass over the objects the garbage collector tracks): every Python
   tensor whose memory lies in a block, a tensor's .grad, another library's array sharing a block
   (CuPy's), and the tensors whose autograd graphs save a block (graphs.py).
3. Reaching the anchors (heap.py): a sweep down from the program's own modules and the locals of
   live frames; then, for what it did not reach, a climb up from the anchors to any module's
   globals. Each reached anchor also places what hangs beside it (`Finder._claim`).
4. Names only along the paths found (edges.py).
Nothing here runs the program's code. The caller holds automatic collection off. During the run
the search is made in a copy of the process (forked.py), so the program does not wait for it.
"""
from __future__ import annotations

import collections
import gc
import time
import types

from . import edges, first_sweep, graphs, heap
from .anchors import find_anchors
from .blocks import (Spans, TensorKind, cuda_tensors, live_blocks, take_baseline, tensor_field,  # noqa: F401
                     thread_entry, user_frames)
from .roots import Roots

MAX_FRAMES = 8  # of the allocating stack kept per group
MAX_GROUPS = 8
MAX_HOLDERS = 6  # distinct holder patterns per group (without stacks, all is one group)
MAX_SIZES = 3  # most common block sizes kept per holder pattern and for the unheld blocks
# The sweep goes first, where a program keeps its own things, until it has cost about what a few
# heap scans of the climb cost (a twentieth of the heap's objects), then the climb takes over.
SWEEP_SHARE = 0.3  # of the budget left after the anchors are found
SWEEP_HEAP_FRACTION = 20
SWEEP_MIN_OBJECTS = 20_000
CLIMB_TOGETHER = 8  # anchors climbed from together: one heap scan per level serves them all
FRUITLESS_CLIMBS = 3  # rounds in a row that reach no root before the climb stops
PREPASS_REFERENCES = 20_000_000  # heap objects x anchors asked about in the one scan before the climb
GRAPH_SHARE = 0.5  # of the budget left after the tensors are reached, for reading autograd graphs
CLAIM_SHARE = 0.2  # of the budget left, for each short sweep beside a placed anchor
# Why a block has no path: nothing in Python refers to it; something does, but nothing reachable
# from the program's modules or frames holds that (C code or a dead cycle); the budget ran out.
# At exit, "cublas-workspace": a block of a workspace's size that no tensor the first sweep reached
# covers (first_sweep.py), confirmed or not by the exit (exit.py).
WHY = ("no-python-object", "unreachable", "not-reached", "cublas-workspace")


class Finder:
    """Places each block (a key of `spans`): the labels of the path to what holds it, or why not."""

    def __init__(self, torch, spans: Spans, budget: heap.Budget, roots: Roots, skip_ids: set):
        self.torch = torch
        self.spans = spans
        self.budget = budget
        self.roots = roots
        self.skip_ids = skip_ids
        self.placed: dict = {}  # block key -> labels
        self.why: dict = dict.fromkeys(range(len(spans)), "no-python-object")
        self.dead: dict = {}  # block key -> type of the highest object found above its holder
        self.phases: dict = {}
        self.heap_objects = 0
        self.tensors = 0
        self.graph_nodes = 0
        self.graph_grads = 0  # tensors whose .grad carries an autograd graph (create_graph=True)
        self.stopped: str | None = None
        self.scan_s = 0.0  # what one heap scan (gc.get_referrers) is expected to cost
        self.mine: set = set()  # ids of the search's own containers that hold the program's objects
        self.named: dict = {}  # a step's label, for the paths that share it (edges.labels)
        self.pools: dict = {}  # a CUDA graph's private pool id -> the keys of its segments' blocks

    def run(self) -> None:
        mark = time.monotonic()
        anchors, holders, heads = self._anchors()  # id -> object; id -> [(block key, suffix labels)]
        self.phases["anchors_s"] = time.monotonic() - mark
        for entries in holders.values():
            for key, _ in entries:
                self.why[key] = "not-reached"
        mark = time.monotonic()
        # The sweep also looks for the tensors that hold autograd graphs: what a graph saves is
        # placed through its tensor's path, with no climb (graph_holders below).
        head_labels = self._sweep(anchors, holders, {id(h[0]): h[0] for h in heads})
        self.phases["sweep_s"] = time.monotonic() - mark
        # What no tensor reached holds may be saved in an autograd graph: a tensor that holds a
        # graph is its holder (read only now: a model's weights are saved in every graph too, and
        # are the model's before they are any graph's). Reached graphs are read first.
        rest = len(self.spans) - len(self.placed)
        if heads and rest and not self.budget.over():
            mark = time.monotonic()
            heads.sort(key=lambda h: id(h[0]) not in head_labels)
            found, self.graph_nodes, stopped = graphs.graph_holders(
                heads, self.spans.of_tensor, self.placed, rest, self.budget.share(GRAPH_SHARE), TensorKind(self.torch),
                reached=set(head_labels))
            self.phases["graphs_s"] = time.monotonic() - mark
            if stopped:
                self.stopped = f"graphs ({stopped})"
            for key, candidates in found.items():
                reached = [(head, labels) for head, labels in candidates if id(head) in head_labels]
                if reached:
                    head, labels = reached[0]
                    self.placed[key] = head_labels[id(head)] + labels
                    continue
                for head, labels in candidates:
                    anchors[id(head)] = head
                    holders.setdefault(id(head), []).append((key, labels))
                self.why[key] = "not-reached"
            # The loop's lists refer to the heads: a climb from a head would find them first.
            del found
            candidates = reached = None
        mark = time.monotonic()
        self._climb(anchors, holders)
        self.phases["climb_s"] = time.monotonic() - mark
        for key in self.placed:
            self.why.pop(key, None)

    def run_first(self, blocks: list, sizes: frozenset) -> dict | None:
        """The exit's first sweep (first_sweep.py): where it places every block but some of a
        cuBLAS workspace's size, those are marked so and {device: [bytes, count]} of them is
        returned ({} where it placed every block). None, and nothing placed, where the full search
        must be made (`run`)."""
        mark = time.monotonic()
        roots = self.roots
        start, labels = roots.sweep_start()
        sweep = first_sweep.TensorSweep(self.torch, self.spans, roots.closed() | self.skip_ids | self.mine, _allow,
                                        lambda cls: _user_class(cls, roots.user_modules),
                                        self.budget.share(first_sweep.SHARE))
        sweep.run(start)
        del start
        self.phases["first_sweep_s"] = time.monotonic() - mark
        self.phases["first_swept"] = sweep.reached
        # Left open: blocks of a workspace's size only, whether the sweep ran out of objects to reach
        # or was cut short (the exit confirms them either way), or the full search decides.
        workspaces = first_sweep.open_workspaces(sweep.open, blocks, sizes)
        if workspaces is None:
            return None
        placed: dict = {}
        for target, path in self._named_paths(sweep, sweep.anchors, labels):
            if path is None:
                return None  # a path not recovered: the full search names it
            for key, suffix in sweep.holders[target]:
                placed.setdefault(key, path + suffix)
        self.placed.update(placed)
        self.why = dict.fromkeys(sweep.open, "cublas-workspace")
        self.heap_objects, self.tensors = sweep.reached, sweep.tensors
        self.phases["sweep_s"] = time.monotonic() - mark
        return workspaces

    def _anchors(self) -> tuple[dict, dict, list]:
        """The anchors (anchors.py); the heads and their list are the search's own containers."""
        anchors, holders, heads, (self.heap_objects, self.tensors, self.graph_grads) = find_anchors(
            self.torch, self.spans, self.pools)
        self.mine.update(map(id, heads))
        self.mine.add(id(heads))
        return anchors, holders, heads

    # -- 3. reaching them ------------------------------------------------------------
    def _sweep(self, anchors: dict, holders: dict, heads: dict) -> dict:
        """Place what the sweep reaches; return the labels of the paths to the graph-holding
        tensors (`heads`, id -> tensor) it reached."""
        roots = self.roots
        start, labels = roots.sweep_start()
        seen = roots.closed() | self.skip_ids | self.mine | {id(anchors), id(holders), id(heads)}
        sweep = heap.Sweep(set(holders) | set(heads), seen, _allow,
                           lambda cls: _user_class(cls, roots.user_modules), self.budget.share(SWEEP_SHARE),
                           max_objects=max(SWEEP_MIN_OBJECTS, self.heap_objects // SWEEP_HEAP_FRACTION))
        sweep.run(start)
        del start
        self.phases["swept"] = sweep.reached
        head_labels = {}
        for target, path in self._named_paths(sweep, {**heads, **anchors}, labels):
            if path is None:
                continue
            if target in heads:
                head_labels[target] = path
            if target in holders and self._open(target, holders):
                self._place(target, holders, path)
        return head_labels

    def _named_paths(self, sweep: heap.Sweep, objects: dict, labels: dict):
        """(id, its path's labels, or None where no path was recovered) of what the sweep found,
        nearest first."""
        chains = heap.paths(sweep.levels, sweep.found, objects, edges.named)
        sweep.levels.clear()
        for target, _depth in sorted(sweep.found.items(), key=lambda kv: kv[1]):
            chain = chains.pop(target, None)
            yield target, edges.labels(chain, labels[id(chain[0])], self.named) if chain else None

    def _climb(self, anchors: dict, holders: dict) -> None:
        sizes = self.spans.sizes()
        pending = sorted((i for i in holders if self._open(i, holders)),
                         key=lambda i: -max(sizes.get(k, 0) for k, _ in holders[i]))
        if not pending:
            return
        root_labels = self.roots.climb_roots()
        # One heap scan costs about what the pass that found the anchors did, until one is timed.
        self.scan_s = self.phases.get("anchors_s", 0.0)
        pending = self._referred(pending, anchors, holders, root_labels)
        together = 1  # the first climb alone: what it places beside it often places the rest
        scans = fruitless = 0
        while pending and not self.budget.over():
            starts = [anchors[i] for i in pending[:together]]
            together = CLIMB_TOGETHER
            climb = heap.Climb(root_labels, self.mine | {id(anchors), id(holders), id(starts), id(pending)},
                               self.budget, scan_s=self.scan_s)
            climb.run(starts)
            self.scan_s = climb.scan_s
            scans += climb.scans
            for s in starts:
                chain = climb.chains.get(id(s))
                if chain is not None:
                    root = root_labels[id(chain[0])]
                    self._place(id(s), holders, edges.labels(chain, root, self.named))
                    self._claim(chain, root, anchors, holders)
                elif id(s) in climb.dead:
                    for key, _ in holders[id(s)]:
                        if key not in self.placed:
                            self.why[key] = "unreachable"
                            self.dead[key] = edges.short_type(type(climb.dead[id(s)]))
            tried = {id(s) for s in starts}
            fruitless = 0 if climb.chains else fruitless + 1
            if climb.stopped == "time":
                self.stopped = ("climb (time)" if self.budget.over() else
                                f"climb: its next heap scan, about {self.scan_s:.2f} s, would pass the budget")
                break
            if fruitless >= FRUITLESS_CLIMBS:
                # Rounds in a row whose every way up ended below any root: what is left is most
                # likely held the same way (a dead cycle, C++), and the exit's collection tells.
                self.stopped = f"climb ({FRUITLESS_CLIMBS} rounds in a row reached no root)"
                break
            del climb, starts
            pending = [i for i in pending if i not in tried and self._open(i, holders)]
        self.phases["climb_scans"] = scans

    def _referred(self, pending: list, anchors: dict, holders: dict, roots: dict) -> list:
        """One heap scan for many anchors at once: those nothing refers to (a tensor kept alive
        from C++, as autograd keeps a leaf) are unreachable without a climb of their own. The
        scan's cost grows with the anchors asked about, so fewer are asked in a bigger heap."""
        if len(pending) <= CLIMB_TOGETHER or self.budget.left() < self.scan_s:
            return pending
        many = max(16, min(256, PREPASS_REFERENCES // max(1, self.heap_objects)))
        asked = tuple(anchors[i] for i in pending[:many])
        mark = time.monotonic()
        referred = _referred_ids(asked, self.mine | {id(anchors), id(holders), id(asked), id(pending)})
        self.scan_s = time.monotonic() - mark
        dead = {id(a) for a in asked if id(a) not in referred and id(a) not in roots}
        for i in dead:
            for key, _ in holders[i]:
                if key not in self.placed:
                    self.why[key] = "unreachable"
                    self.dead[key] = edges.short_type(type(anchors[i]))
        self.phases["unreferred"] = len(dead)
        return [i for i in pending if i not in dead]

    def _claim(self, chain: list, root: list, anchors: dict, holders: dict) -> None:
        """Anchors held beside one just placed: a short sweep down from each object on its path,
        nearest first (a list of a thousand leaked tensors is placed from one of them)."""
        want = {i for i in holders if self._open(i, holders)}
        closed = self.roots.closed() | {id(anchors), id(holders)}
        for j in range(len(chain) - 2, -1, -1):
            if self.budget.over() or not want:
                return
            sweep = heap.Sweep(want, set(closed), _allow, lambda cls: False, self.budget.share(CLAIM_SHARE),
                               max_depth=len(chain) - j)
            sweep.run([chain[j]])
            subs = heap.paths(sweep.levels, sweep.found, anchors, edges.named)
            sweep.levels.clear()
            for target, sub in subs.items():
                self._place(target, holders, edges.labels(chain[:j] + sub, root, self.named))
                want.discard(target)

    def _open(self, anchor: int, holders: dict) -> bool:
        return any(key not in self.placed for key, _ in holders[anchor])

    def _place(self, anchor: int, holders: dict, labels: list) -> None:
        for key, suffix in holders[anchor]:
            if key not in self.placed:
                self.placed[key] = labels + suffix


def _referred_ids(asked: tuple, ignore: set) -> set:
    """The ids of those of `asked` that an object the garbage collector knows refers to (other
    than the containers in `ignore`): one heap scan for all of them."""
    wanted = {id(a) for a in asked}
    refs = gc.get_referrers(*asked)
    referred = set()
    for r in refs:
        if id(r) not in ignore and id(r) != id(refs):
            referred.update(wanted.intersection(map(id, gc.get_referents(r))))
    return referred


def _allow(t):
    if issubclass(t, types.ModuleType):
        return False
    if issubclass(t, type):
        return None  # a class: walked into when it is the program's own
    return True


def _user_class(cls, user_modules: set) -> bool:
    try:
        return vars(cls).get("__module__") in user_modules
    except Exception:
        return False


# -- a search -------------------------------------------------------------------

def investigate(torch, kind: TensorKind, baseline: dict, budget_s: float, roots: Roots, thread_names: dict,
                all_live: bool = False, skip_ids: set | None = None, blocks: list | None = None,
                first: bool = False) -> dict:
    """Group the live memory allocated since the baseline (with `all_live`, all of the live memory,
    each group marked new or not) by allocating stack, and find who holds it. `baseline` is what
    `take_baseline` returned; `blocks` replaces the allocator's view (tests). `first` (at exit):
    try the first sweep (Finder.run_first) before the full search; the result's "workspaces" then
    lists [device, bytes, count] of the blocks it took for cuBLAS's, for the exit to confirm."""
    started = time.monotonic()
    budget = heap.Budget(budget_s, started)
    source = "allocator"
    if blocks is None:
        try:
            live = live_blocks(torch, pools=True)
        except Exception:
            live = []
        if live or baseline["blocks"]:
            old = baseline["blocks"]
            blocks = [dict(b, new=old.get(b["address"]) != b["size"]) for b in live]
        else:
            # No allocator snapshot here (the cudaMallocAsync backend): tensor storages instead.
            source = "tensors"
            blocks = [dict(b, new=b["address"] not in baseline["storages"]) for b in _tensor_storages(kind)]
        del live
    snapshot_s = round(time.monotonic() - started, 3)
    if not all_live:
        blocks = [b for b in blocks if b["new"]]
    spans = Spans((b["address"], b["size"], i) for i, b in enumerate(blocks))
    finder = Finder(torch, spans, budget, roots, {id(baseline), id(blocks)} | set(skip_ids or ()))
    for i, b in enumerate(blocks):
        if b.get("pool") is not None:
            finder.pools.setdefault(tuple(b["pool"]), []).append(i)
    # (CUDA graphs' pools are held by their graphs, which only the full search's anchors look for)
    workspaces = (finder.run_first(blocks, first_sweep.workspace_sizes()) if first and blocks and not finder.pools
                  else None)
    if workspaces is None:  # (a first sweep that decided nothing placed nothing)
        finder.run()
    groups = _groups(blocks, finder, thread_names)
    fresh = [b for b in blocks if b["new"]]
    unreached = sum(1 for why in finder.why.values() if why == "not-reached")
    if budget.over():
        stop = f"stopped at its {budget_s:g} s budget"
    elif finder.stopped:
        stop = f"stopped early ({finder.stopped})"
    else:
        stop = "reached the end of what the sweep and the climb could reach"
    # Every block placed, or held by no Python object at all: then no garbage cycle holds any.
    complete = finder.stopped is None and all(why == "no-python-object" for why in finder.why.values())
    gave_up = None
    if unreached:
        gave_up = (f"{stop} with {unreached} of {len(blocks)} allocations not reached "
                   f"({finder.heap_objects:,} objects in the heap)")
    return {"source": source, "all_live": all_live, "candidate_bytes": sum(b["size"] for b in fresh),
            "candidate_count": len(fresh), "groups": groups, "visited": finder.heap_objects,
            "gave_up": gave_up, "elapsed_s": round(time.monotonic() - started, 3), "snapshot_s": snapshot_s,
            "budget_s": budget_s, "tensors": finder.tensors, "graph_nodes": finder.graph_nodes,
            "graph_grads": finder.graph_grads, "complete": complete,
            "phases": {k: round(v, 4) if type(v) is float else v for k, v in finder.phases.items()},
            **({"workspaces": [[d, n, c] for d, (n, c) in sorted(workspaces.items(), key=lambda kv: str(kv[0]))]}
               if workspaces else {})}


def _groups(blocks: list, finder: Finder, thread_names: dict) -> list:
    """The blocks grouped by device, new or not, and allocating stack; holders by path pattern."""
    groups: dict = {}
    stacks: dict = {}  # a stack -> (the program's frames in it, the thread it ran): many blocks share one
    for i, b in enumerate(blocks):
        frames = b["frames"]
        stack = tuple(frames)
        known = stacks.get(stack)
        if known is None:
            known = stacks[stack] = tuple(user_frames(frames)[:MAX_FRAMES]), thread_entry(frames)
        mine, entry = known
        key = (b["device"], b["new"], mine)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"device": b["device"], "new": b["new"], "bytes": 0, "count": 0,
                               "frames": [list(f) for f in key[2]], "thread": None,
                               "holders": {}, "unheld_bytes": 0, "unheld_count": 0,
                               "unheld_sizes": collections.Counter(), "unheld_why": {}}
        g["bytes"] += b["size"]
        g["count"] += 1
        if entry is not None:
            g["thread"] = thread_names.get(entry) or [f"a thread running {entry[1]}()"]
        labels = finder.placed.get(i)
        if labels is None:
            g["unheld_bytes"] += b["size"]
            g["unheld_count"] += 1
            g["unheld_sizes"][b["size"]] += 1
            why = finder.why.get(i, "not-reached")
            w = g["unheld_why"].setdefault(why, [why, 0, 0, finder.dead.get(i)])
            w[1] += b["size"]
            w[2] += 1
            continue
        text = edges.render(labels)
        pattern = edges.pattern(text)
        h = g["holders"].get(pattern)
        if h is None:  # the first path of a pattern stands for the others
            h = g["holders"][pattern] = {"path": text, "pattern": pattern, "kind": edges.holder_kind(labels),
                                         "count": 0, "bytes": 0, "sizes": collections.Counter()}
        h["count"] += 1
        h["bytes"] += b["size"]
        h["sizes"][b["size"]] += 1
    out = []
    for new in (True, False):  # the biggest groups of each: old memory must not crowd out new
        out += sorted((g for g in groups.values() if g["new"] is new), key=lambda g: -g["bytes"])[:MAX_GROUPS]
    for g in out:
        g["holders"] = sorted(g["holders"].values(), key=lambda h: -h["bytes"])[:MAX_HOLDERS]
        for h in g["holders"]:  # how alike they are: the most common sizes, [size, count]
            h["sizes"] = [[size, n] for size, n in h["sizes"].most_common(MAX_SIZES)]
        g["unheld_sizes"] = [[size, n] for size, n in g["unheld_sizes"].most_common(MAX_SIZES)]
        g["unheld_why"] = sorted(g["unheld_why"].values(), key=lambda w: -w[1])
    return out


def _tensor_storages(kind: TensorKind) -> list[dict]:
    seen, out = set(), []
    for tensor, address, size in cuda_tensors(kind):
        if address not in seen:
            seen.add(address)
            out.append({"device": tensor_field(tensor, "device").index, "address": address, "size": size,
                        "frames": []})
    return out
