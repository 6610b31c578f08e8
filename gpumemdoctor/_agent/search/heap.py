"""Reaching objects in the program's heap without running any of its code.

Two moves, both made of the garbage collector's own C traversals:
- `Sweep`: breadth-first from named roots, a level at a time (gc.get_referents over a chunk of
  objects in one call), keeping no parent pointers: the paths are recovered afterwards, only for
  what was found, one level up at a time for all of them at once (`paths`).
- `Climb`: upward from a few objects with gc.get_referrers (one scan of the heap per level), for
  what the sweep did not reach: a library's module globals, what only C code or a dead cycle holds.
A scan costs about 12 ns per reference in the heap; a sweep about 0.5 us per reference it follows
(measured, docs/performance.md): the sweep goes first where the program keeps its own things, near
its roots, and the climb takes over for the rest.
Types are checked with type(obj), never isinstance (which asks the object for __class__).
"""
from __future__ import annotations

import gc
import itertools
import time
import types

CHUNK = 2048  # objects per gc.get_referents call: one C call, a bounded list
BIG = 50_000  # items of a container that the sweep walks into
_SIZED = frozenset((list, tuple, dict, set, frozenset))
_referents = gc.get_referents
_tracked = gc.is_tracked


class Budget:
    """A deadline, checked between bounded pieces of work."""

    def __init__(self, seconds: float, start: float | None = None):
        self.start = time.monotonic() if start is None else start
        self.deadline = self.start + seconds

    def over(self) -> bool:
        return time.monotonic() > self.deadline

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def share(self, fraction: float) -> "Budget":
        """This fraction of what is left, from now."""
        return Budget(self.left() * fraction)


class Sweep:
    """A level-by-level sweep down from roots. `levels[k]` holds the objects first reached at
    depth k, in the order they were reached; `found` maps the id of each target reached to its
    depth. `allow(type)` says whether objects of a type are walked into: True, False (a module:
    a road to the whole heap), or None to ask `allow_object(obj)` (classes: a program's own
    classes are walked into, a library's are not)."""

    def __init__(self, targets: set, seen: set, allow, allow_object, budget: Budget,
                 max_depth: int = 64, max_objects: int = 1 << 62):
        self.targets = targets
        self.seen = seen
        self.allow = allow
        self.allow_object = allow_object
        self.type_ok: dict = {}
        self.dict_kind: dict = {}  # type -> 2: dict, 1: a subclass of dict, 0: anything else
        self.budget = budget
        self.max_depth = max_depth
        self.max_objects = max_objects
        self.levels: list[list] = []
        self.found: dict = {}
        self.reached = 0
        self.stopped: str | None = None  # why it ended before every target was found

    def run(self, roots: list) -> None:
        level = self._walkable([r for r in roots if id(r) not in self.seen])
        self.seen.update(map(id, level))
        self._hits(level, 0)
        self.levels.append(level)
        self.reached += len(level)
        while level and not self._done():
            if len(self.levels) > self.max_depth:
                self.stopped = "depth"
                return
            nxt: list = []
            self.levels.append(nxt)
            for i in range(0, len(level), CHUNK):
                if self.budget.over():
                    self.stopped = "time"
                    return
                if self.reached >= self.max_objects:
                    self.stopped = "objects"
                    return
                kids = list(filter(_tracked, self._referents(level[i:i + CHUNK])))
                fresh = dict(zip(map(id, kids), kids))
                del kids
                new_ids = list(itertools.filterfalse(self.seen.__contains__, fresh))
                self.seen.update(new_ids)
                new = self._walkable(list(map(fresh.__getitem__, new_ids)))
                del fresh
                room = self.max_objects - self.reached
                if len(new) > room:
                    new = new[:max(0, room)]
                    self.stopped = "objects"
                self._hits(new, len(self.levels) - 1)
                nxt += new
                self.reached += len(new)
                if self._done() or self.stopped:
                    return
            level = nxt

    def _done(self) -> bool:
        """Whether the sweep has what it came for: every target."""
        return len(self.found) >= len(self.targets)

    def _referents(self, chunk: list):
        """What the objects refer to, but a dict's keys: a tensor that is a key (of an optimizer's
        state, say) is named where it is a value (its module's parameters). The climb, which
        misses nothing, finds what only a key holds."""
        kinds = self.dict_kind
        for t in set(map(type, chunk)).difference(kinds):
            kinds[t] = 2 if t is dict else 1 if issubclass(t, dict) else 0
        if not any(kinds[t] for t in set(map(type, chunk))):
            return _referents(*chunk)
        out = _referents(*itertools.compress(chunk, map((0).__eq__, map(kinds.__getitem__, map(type, chunk)))))
        out += itertools.chain.from_iterable(map(dict.values, itertools.compress(
            chunk, map((2).__eq__, map(kinds.__getitem__, map(type, chunk))))))
        for d in itertools.compress(chunk, map((1).__eq__, map(kinds.__getitem__, map(type, chunk)))):
            keys = set(map(id, dict.keys(d)))
            out += [r for r in _referents(d) if id(r) not in keys]
        return out

    def _hits(self, objs: list, depth: int) -> None:
        if self.targets:
            for i in self.targets.intersection(map(id, objs)):
                self.found.setdefault(i, depth)

    def _walkable(self, objs: list) -> list:
        ok = self.type_ok
        kinds = set(map(type, objs))
        for t in kinds.difference(ok):
            ok[t] = self.allow(t)
        if not all(ok[t] is True for t in kinds):
            out = list(itertools.compress(objs, map(ok.__getitem__, map(type, objs))))
            if any(ok[t] is None for t in kinds):
                out += [o for o in objs if ok[type(o)] is None and self.allow_object(o)]
            objs = out
        if kinds & _SIZED:
            # A container of more than BIG items is left to the climb: sweeping it would cost what
            # many heap scans cost, and what a program leaks is rarely one of a million items.
            objs = [o for o in objs if type(o) not in _SIZED or len(o) <= BIG]
        return objs


def paths(levels: list[list], found: dict, objects: dict, acceptable=None) -> dict:
    """{id: [root, ..., object]} for each id in `found` (id -> the depth it was reached at;
    `objects`: id -> the object). One pass over each level above a found object, for all of them
    at once: at each level up, the parent is the first object (in the order they were reached)
    that refers to the one below and that `acceptable(parent, child)` accepts; the first that
    refers to it when none is accepted."""
    want: dict = {}  # depth -> {id: object} that need a parent at depth - 1
    for key, depth in found.items():
        want.setdefault(depth, {})[key] = objects[key]
    parent_of: dict = {}  # id -> its chosen parent
    for depth in range(max(want, default=0), 0, -1):
        here = want.get(depth)
        if not here:
            continue
        candidates = _referrers_in(levels[depth - 1], set(here))
        up = want.setdefault(depth - 1, {})
        for key, child in here.items():
            options = candidates.get(key) or []
            chosen = next((p for p in options if acceptable is None or acceptable(p, child)),
                          options[0] if options else None)
            if chosen is not None:
                parent_of[key] = chosen
                up.setdefault(id(chosen), chosen)
    out = {}
    known: dict = {}  # id -> [root, ..., that object]: each object's path is made once, for all below it
    for key in found:
        below = []
        obj, i = objects[key], key
        while i not in known:
            below.append(obj)
            obj = parent_of.get(i)
            if obj is None:
                chain = []
                break
            i = id(obj)
        else:
            chain = known[i]
        for obj in reversed(below):
            chain = [*chain, obj]
            known[id(obj)] = chain
        if len(chain) == found[key] + 1:
            out[key] = chain
    return out


def _referrers_in(objs: list, wanted: set, per_object: int = 3) -> dict:
    """id -> up to `per_object` objects of `objs` (in their order) that refer to it."""
    out: dict = {}
    for i in range(0, len(objs), CHUNK):
        chunk = objs[i:i + CHUNK]
        if wanted.isdisjoint(map(id, _referents(*chunk))):
            continue
        for candidate in chunk:
            for r in _referents(candidate):
                key = id(r)
                if key in wanted:
                    found = out.setdefault(key, [])
                    if len(found) < per_object and all(f is not candidate for f in found):
                        found.append(candidate)
    return out


# -- climbing ---------------------------------------------------------------------

_PLAIN = frozenset((dict, list, tuple, set, frozenset, types.CellType, types.FunctionType,
                    types.MethodType, types.FrameType, types.TracebackType, types.GeneratorType,
                    types.CoroutineType, types.AsyncGeneratorType))


def _rank(obj) -> int:
    """Which referrers to climb first when there are too many: an object of some class (an
    attribute holds it), then plain containers, then the rest; classes last (their referrers
    are all their instances)."""
    t = type(obj)
    if issubclass(t, type):
        return 3
    if t in _PLAIN:
        return 1
    if t.__module__ == "builtins":
        return 2
    return 0


class Climb:
    """Climbs from `starts` towards `roots` (a set of ids): a beam search on gc.get_referrers, one
    heap scan per level for all starts together. `chains[id(start)]` is [root, ..., start] once a
    root is reached. A start whose way up meets another start's joins it. `dead[id(start)]` is
    the highest object found above a start when every way up ended without a root: nothing the
    garbage collector knows refers to it (held from C, or by nothing but a dead cycle).
    `ignore`: ids of the caller's own containers that hold any of these objects."""

    def __init__(self, roots, ignore: set, budget: Budget, beam: int = 32, max_depth: int = 40,
                 scan_s: float = 0.0):
        self.roots = roots
        self.ignore = ignore
        self.budget = budget
        # What one heap scan is expected to cost (the last one's time): a scan is not started when
        # less than that is left, so a big heap does not carry the search past its budget.
        self.scan_s = scan_s
        self.beam = beam
        self.max_depth = max_depth
        self.chains: dict = {}
        self.dead: dict = {}
        self.scans = 0
        self.stopped: str | None = None
        self.keep: list = []

    def run(self, starts: list) -> None:
        keep = self.keep
        keep.extend(starts)  # strong references: no id is reused while the climb runs
        below: dict = {}  # id -> index in keep of the object one step nearer its start
        origin: dict = {}  # id -> id of the start it was reached from
        slot: dict = {}  # id -> index in keep
        for i, s in enumerate(starts):
            origin[id(s)] = id(s)
            slot[id(s)] = i
        joins: list = []  # (start, id of a node another start reached first, slot of the node below it)
        open_ = set()
        for s in starts:
            if id(s) in self.roots:
                self.chains[id(s)] = [s]
            else:
                open_.add(id(s))
        frontier = [s for s in starts if id(s) in open_]
        depth = 0
        while frontier and open_:
            if depth >= self.max_depth:
                self.stopped = "depth"
                break
            if self.budget.over() or self.budget.left() < self.scan_s:
                self.stopped = "time"
                break
            depth += 1
            ft = tuple(frontier)
            del frontier
            mark = time.monotonic()
            refs = gc.get_referrers(*ft)
            self.scan_s = time.monotonic() - mark
            self.scans += 1
            mine = {id(ft), id(keep), id(refs)}
            at = {id(o): o for o in ft}
            nxt: list = []
            for r in refs:
                ir = id(r)
                if ir in mine or ir in self.ignore or ir == id(at):
                    continue
                kid = next((c for c in _referents(r) if id(c) in at), None)
                if kid is None:
                    continue
                start = origin[id(kid)]
                if start not in open_:
                    continue
                if ir in origin:
                    if origin[ir] != start:
                        joins.append((start, ir, slot[id(kid)]))
                    continue
                origin[ir] = start
                slot[ir] = len(keep)
                keep.append(r)
                below[ir] = slot[id(kid)]
                if ir in self.roots:
                    self.chains[start] = self._chain(r, below)
                    open_.discard(start)
                    continue
                nxt.append(r)
            del refs
            self._settle(joins, open_, below)
            going = {origin[id(o)] for o in nxt}
            waiting = {j[0] for j in joins}
            for o in ft:  # starts whose every way up ended here: nothing above but C or a dead cycle
                s = origin[id(o)]
                if s in open_ and s not in going and s not in waiting:
                    self.dead.setdefault(s, o)
                    open_.discard(s)
            del ft, at
            frontier = self._prune(nxt, open_, origin)
            del nxt
        self._settle(joins, open_, below)
        if open_ and self.stopped is None:
            self.stopped = "joined a way up that ended"

    def _settle(self, joins: list, open_: set, below: dict) -> None:
        """A start that met another start's way up shares its chain above the meeting point."""
        for start, met, kid in joins:
            if start not in open_:
                continue
            chain = None
            for other in self.chains.values():
                for i, obj in enumerate(other):
                    if id(obj) == met:
                        chain = other[:i + 1]
                        break
                if chain is not None:
                    break
            if chain is None:
                continue
            tail = [self.keep[kid]]
            i = below.get(id(tail[-1]))
            while i is not None:
                tail.append(self.keep[i])
                i = below.get(id(tail[-1]))
            self.chains[start] = chain + tail
            open_.discard(start)

    def _prune(self, objs: list, open_: set, origin: dict) -> list:
        objs = [o for o in objs if origin[id(o)] in open_]
        if len(objs) <= self.beam:
            return objs
        per = max(2, self.beam // max(1, len(open_)))
        objs.sort(key=_rank)
        taken: dict = {}
        out = []
        for o in objs:
            s = origin[id(o)]
            if taken.get(s, 0) < per:
                taken[s] = taken.get(s, 0) + 1
                out.append(o)
        return out

    def _chain(self, top, below: dict) -> list:
        chain = [top]
        i = below.get(id(top))
        while i is not None:
            chain.append(self.keep[i])
            i = below.get(id(chain[-1]))
        return chain
