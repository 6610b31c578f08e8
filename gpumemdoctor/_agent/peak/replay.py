"""The allocator's recorded events walked back to the moment of its highest allocated memory, and
what was live then, told apart by when each block was made and freed. Pure: it reads a device's
trace of events, the marks (history.py) and the optimizers' storages, and returns one record.

The walk starts from what is allocated now (PyTorch's allocated bytes: the events' sizes are the
blocks', which add up to it exactly) and undoes each event, newest first: an allocation subtracts
its block, a free (`free_requested`, when PyTorch's allocated memory drops) adds it back; the same
walk pairs each allocation with its block's free (GPT-2's 6,754 entries: 2.2 ms on the development
machine's CPU; 3.4 with one walk to the peak and another from the start). The
highest total met is the allocated peak, if it lies within the recorded events (`complete`: the
counter read with the events says whether it does). The blocks live then:
- made within the events and still allocated now: a parameter, a gradient or optimizer state
  (their storages' addresses, read with the events), or else `kept-tensors`;
- made within the events and freed since, by when (marks: the program's backward() and optimizer
  steps):
  - made in a backward and freed after it ended: `gradients` (the .grad a step sets to None later);
  - made in a backward, or in an optimizer step, and freed within it: `temporaries`;
  - made outside both and freed while a later backward ran: `activations` (saved by a forward for
    its backward);
  - made outside both and freed with no backward in between: `gathered` when held with the oldest
    of them, freed no earlier than it (an evaluation's graphs or outputs, a concatenation's pieces
    and their result), else `temporaries` (made later, freed sooner);
- made before the events began: the optimizers' storages by their addresses, the rest still
  allocated `kept-tensors`, and what was freed since `unclassified`.
Where the largest gathered block is as large as the gathered ones made before it, it is their
concatenation (`joined`). Each part keeps its blocks' count and when its first and last were made; the parts are
contract.HISTORY_PARTS, which the records' shape declares.
"""
from __future__ import annotations

import time
from bisect import bisect_right

from ...contract import reaches_counter

# The walk's highest total against the counter (contract.reaches_counter): the history's sizes are
# the blocks' and add up to allocated memory exactly (3.5 MiB above the counter on GPT-2's 14.7 GiB,
# H100; 20 MiB below it on timm's ResNet-50, 6.3 GB, H200).
JOINED_SLACK = 0.01  # a concatenation's result against its pieces (blocks are rounded to 512 bytes)
GATHERED_SLACK = 0.25  # of the oldest gathered block's life: freed this much before it, still with it
BACKWARD, BACKWARD_END, STEP, STEP_END = 1, 2, 3, 4  # the kinds of marks (history.Marks)
_STORAGE = {1: "parameters", 2: "gradients", 3: "optimizer-state"}
# An entry's action walking back: an allocation undone (-1), a free undone (+1), a segment's (-2, +2).
_SIGN = {"alloc": -1, "free_requested": 1, "segment_alloc": -2, "segment_map": -2, "segment_free": 2,
         "segment_unmap": 2}


CHUNK = 128  # entries (or blocks) a Walk goes through between two looks at the clock
WALK_BACK, LIVE_AT, SPLIT, DONE = range(4)  # a Walk's stages


def replay(trace: list, allocated: int, times: list, kinds: list, storages: dict, sizes: dict,
           reserved: int | None = None, counter: int | None = None, ring_full: bool = False) -> dict | None:
    """The allocated peak found in `trace` (a device's entries, oldest first), walking back from
    `allocated` (PyTorch's allocated bytes now) and `reserved` (its segments' bytes now). The marks:
    `times` (time_us, in order) and their `kinds`; `storages`: {address: 1 parameters, 2 gradients,
    3 optimizer state} of the storages alive now, `sizes` their bytes. `counter`: PyTorch's allocated
    peak counter, read with the trace. None when the trace holds no allocation or free. Makes no
    tuple: it runs inside a reading whose containers neutral.Bulk accounts for (dicts and lists).
    The whole Walk at once."""
    walk = Walk(trace, allocated, times, kinds, storages, sizes, reserved, counter, ring_full)
    walk.run(None)
    return walk.result


class Walk:
    """replay() in parts, each as long as its caller allows: `run(deadline)` goes on from where the
    last part stopped until it is done (True, `result` set) or `time.perf_counter()` has passed
    `deadline` (False; None: no deadline), looking at the clock every CHUNK entries. The stages: the
    walk back through the entries (WALK_BACK), the allocations live at the peak (LIVE_AT), their
    parts (SPLIT, with the rest, which is short). What it keeps between parts is a few dicts and lists
    (and the blocks' indices, untracked ints), which the reading's Bulk runs account for."""

    __slots__ = ("trace", "allocated", "times", "kinds", "storages", "sizes", "reserved", "counter", "ring_full",
                 "stage", "i", "state", "waiting", "blocks", "made", "freed", "later", "keys", "known", "parts",
                 "unbacked", "held", "peak_t", "stretch", "end_t", "result")

    def __init__(self, trace: list, allocated: int, times: list, kinds: list, storages: dict, sizes: dict,
                 reserved: int | None = None, counter: int | None = None, ring_full: bool = False):
        self.trace = trace
        self.allocated = allocated
        self.times = times
        self.kinds = kinds
        self.storages = storages
        self.sizes = sizes
        self.reserved = reserved
        self.counter = counter
        self.ring_full = ring_full
        self.stage = WALK_BACK
        self.i = len(trace)  # the next entry (WALK_BACK: down from the newest) or block pair (LIVE_AT, SPLIT)
        # The walk back's totals: allocated now, the highest met, the entry it was the state before,
        # the segments' bytes now and then, whether an allocation or a free was met (0 or 1).
        self.state = [allocated, allocated, len(trace), reserved or 0, reserved or 0, 0]
        self.waiting: dict = {}
        self.blocks: list = []
        self.made: dict = {}
        self.freed: dict = {}
        self.later: dict = {}  # made after the peak and still allocated
        self.keys = None  # SPLIT: `made`'s addresses, in a list
        self.known = 0
        self.parts: dict = {}
        # Made outside backward and the steps, freed since with no backward in between (`unbacked`), and
        # kept tensors made within the events (`held`: a concatenation's result may be one): four ints a
        # block, flat, so that what a Walk keeps between two parts is a few containers (_blocks).
        self.unbacked: list = []
        self.held: list = []
        self.peak_t = self.stretch = self.end_t = None  # SPLIT: the peak's time, its stretch's start, "still held"
        self.result = None

    def run(self, deadline) -> bool:
        clock = time.perf_counter
        trace = self.trace
        done = 0  # entries and blocks gone through in this part: the clock is looked at after CHUNK
        while self.stage != DONE:
            if done >= CHUNK and deadline is not None and clock() > deadline:
                return False  # (a part goes a CHUNK at least: a walk always ends, a short one in one part)
            if self.stage == WALK_BACK:
                lo = self.i - CHUNK if self.i > CHUNK else 0
                _walk_back_part(trace, self.waiting, self.blocks, self.state, lo, self.i)
                done += self.i - lo
                self.i = lo
                if lo == 0:
                    self.stage = LIVE_AT if self.state[5] else DONE  # (no allocation nor free: no result)
            elif self.stage == LIVE_AT:
                blocks = self.blocks
                k = self.i if self.i < len(blocks) else 0  # (from WALK_BACK, i is 0)
                hi = k + 2 * CHUNK if k + 2 * CHUNK < len(blocks) else len(blocks)
                _live_at(trace, blocks, self.state[2], self.made, self.freed, self.later, k, hi)
                done += (hi - k) // 2
                self.i = hi
                if hi == len(blocks):
                    self._start_split()
            else:
                done += self._split()
        return True

    def _start_split(self) -> None:
        trace = self.trace
        best_i = self.state[2]
        self.peak_t = trace[best_i - 1]["time_us"] if best_i > 0 else trace[0]["time_us"]
        self.stretch = _last(self.times, self.kinds, self.peak_t, STEP_END)  # the stretch the peak fell in began here
        self.end_t = trace[len(trace) - 1]["time_us"] + 1  # "still held" (for _gathered)
        self.keys = list(self.made)
        self.i = 0
        self.stage = SPLIT

    def _split(self) -> int:
        """A CHUNK of the blocks live at the peak put in their parts; after the last, the rest. How
        many blocks it went through."""
        trace = self.trace
        best_i = self.state[2]
        peak_t, stretch, end_t = self.peak_t, self.stretch, self.end_t
        times, kinds = self.times, self.kinds
        keys = self.keys
        hi = self.i + CHUNK if self.i + CHUNK < len(keys) else len(keys)
        self.known += _split_made(self.made, self.freed, self.storages, times, kinds, stretch, peak_t, end_t,
                                  self.parts, self.unbacked, self.held, keys, self.i, hi)
        done = hi - self.i + 1
        self.i = hi
        if hi < len(keys):
            return done
        parts = self.parts
        old_freed = _freed_since(trace, self.waiting, best_i)
        # With no optimizer step before an outside peak (an evaluation, inference), what is still held and
        # was made after the oldest gathered block is the same gathering's (a concatenation's result, the
        # last batch's outputs): gathered too.
        joined = _gathered(parts, _blocks(self.unbacked), _blocks(self.held),
                           stretch is None and _phase(times, kinds, peak_t) == "outside", end_t)
        self.unbacked = self.held = None
        best = self.state[1]
        _split_older(parts, self.storages, self.sizes, self.made, self.later, best - self.known - old_freed, old_freed)
        out = {}
        for name in parts:
            p = parts[name]
            out[name] = {"bytes": p[0], "blocks": p[1], "first_us": p[2], "last_us": p[3]}
        self.result = {"allocated_peak": best, "reserved_at_peak": self.state[4] if self.reserved is not None else None,
                       "peak_time_us": peak_t, "allocated_now": self.allocated,
                       "complete": reaches_counter(best, self.counter), "ring_full": self.ring_full,
                       "events": len(trace), "phase": _phase(times, kinds, peak_t),
                       "joined": joined, "parts": out}
        self.keys = None
        self.stage = DONE
        return done


def _walk_back_part(trace: list, waiting: dict, blocks: list, state: list, lo: int, hi: int) -> None:
    """The walk back through entries hi-1 down to lo of `trace` (newest first), each event undone: an
    allocation subtracts its block, a free adds it back, a segment's event changes the reserved bytes.
    `state` (Walk.state) holds the allocated total, the highest met, the index of the entry it was the
    state before, the reserved bytes now and at the highest, and whether an event was met; it is left
    holding them after entry lo. Each free met waits in `waiting` (address: its index) for the
    allocation that made its block; each allocation is appended to `blocks` as two indices, its own and
    its free's (len(trace): not freed)."""
    n = len(trace)
    total, best, best_i, segments, best_segments, seen = state
    append = blocks.append
    pop = waiting.pop
    sign = _SIGN
    for i in range(hi - 1, lo - 1, -1):  # (the two common actions compared as strings: no hash of a new str)
        e = trace[i]
        action = e["action"]
        if action == "free_requested":  # a free undone
            waiting[e["addr"]] = i
            total += e["size"]
            if total > best:
                best = total
                best_i = i
                best_segments = segments
        elif action == "alloc":  # an allocation undone
            total -= e["size"]
            append(i)
            append(pop(e["addr"], n))
        else:
            s = sign.get(action)
            if s is not None:  # a segment's: the reserved memory then
                segments += e["size"] if s == 2 else -e["size"]
            continue
        seen = 1
    state[0] = total
    state[1] = best
    state[2] = best_i
    state[3] = segments
    state[4] = best_segments
    state[5] = seen


def _live_at(trace: list, blocks: list, best_i: int, made: dict, freed: dict, later: dict, lo: int,
             hi: int) -> None:
    """Of the allocations in `blocks[lo:hi]` (_walk_back_part's pairs of indices), those live at the
    state before entry `best_i` put in `made` (address: the allocation's entry) and, where freed since,
    in `freed` (address: the free's time_us); those made after it and still allocated put in `later`."""
    n = len(trace)
    for k in range(lo, hi, 2):
        j = blocks[k]
        f = blocks[k + 1]
        if j < best_i <= f:
            address = trace[j]["addr"]
            made[address] = trace[j]
            if f < n:
                freed[address] = trace[f]["time_us"]
        elif f == n:
            later[trace[j]["addr"]] = True


def _freed_since(trace: list, waiting: dict, best_i: int) -> int:
    """The bytes of the blocks made before the events began, live at the state before entry `best_i`,
    and freed since (the frees left `waiting` for an allocation the events do not hold)."""
    old_freed = 0
    for address in waiting:
        f = waiting[address]
        if f >= best_i:
            old_freed += trace[f]["size"]
    return old_freed


def _split_made(made: dict, freed: dict, storages: dict, times: list, kinds: list, stretch, peak_t: int,
                end_t: int, parts: dict, unbacked: list, held: list, keys: list, lo: int, hi: int) -> int:
    """The blocks made within the events and live at the peak (`made`) whose addresses are keys[lo:hi]
    added to `parts` by their part (_part); those _part leaves to _gathered appended to `unbacked`,
    and the kept tensors to `held`, each as four ints: size, made, freed (end_t: not yet), address.
    Returns their bytes."""
    known = 0
    for j in range(lo, hi):
        address = keys[j]
        e = made[address]
        size = e["size"]
        t = e["time_us"]
        known += size
        f = freed.get(address)
        part = _part(address, t, f, storages, times, kinds, stretch, peak_t)
        if part is None:
            unbacked.append(size)  # (four appends: a tuple would come from, or go to, a free list Bulk does not drain)
            unbacked.append(t)
            unbacked.append(end_t if f is None else f)
            unbacked.append(address)
        else:
            _add(parts, part, size, t)
            if part == "kept-tensors":
                held.append(size)
                held.append(t)
                held.append(end_t)
                held.append(address)
    return known


def _split_older(parts: dict, storages: dict, sizes: dict, made: dict, later: dict, old_alive: int,
                 old_freed: int) -> None:
    """The blocks made before the events began added to `parts`: of the `old_alive` bytes still
    allocated, the storages the optimizers name (by their addresses, none made within the events) and
    the rest `kept-tensors`; the `old_freed` bytes freed since, `unclassified`."""
    if old_alive < 0:  # (sizes rounded apart by a few bytes)
        old_alive = 0
    for address in storages:
        if address in made or address in later:
            continue
        size = (sizes.get(address, 0) + 511) // 512 * 512  # the allocator's blocks are 512-byte multiples
        if size > old_alive:
            size = old_alive
        if size > 0:
            _add(parts, _STORAGE[storages[address]], size, None)
            old_alive -= size
    if old_alive > 0:
        _add(parts, "kept-tensors", old_alive, None)
    if old_freed > 0:
        _add(parts, "unclassified", old_freed, None)


def _add(parts: dict, name: str, size: int, made) -> None:
    p = parts.get(name)
    if p is None:
        parts[name] = p = [0, 0, made, made]
    p[0] += size
    p[1] += 1
    if made is not None:
        if p[2] is None or made < p[2]:
            p[2] = made
        if p[3] is None or made > p[3]:
            p[3] = made


def _part(address: int, made, freed, storages: dict, times: list, kinds: list, stretch=None, peak_t=None):
    """A block's part, or None for one made outside backward() and the optimizer steps and freed
    with no backward() in between, or still held and made in the stretch of the peak (since the last
    optimizer step before it) with no backward() in between (_gathered tells those apart)."""
    if freed is None:  # still allocated now
        kind = storages.get(address)
        if kind:
            return _STORAGE[kind]
        made_in = _phase(times, kinds, made)
        if stretch is None or made_in != "outside" or made <= stretch:
            return "kept-tensors"  # (made in an earlier step, by backward() or a step, or no step seen)
        # This step's forward output, or an evaluation's, still held by the program's names: what it
        # made for this moment, not kept from an earlier one.
        backward = _next(times, kinds, made, BACKWARD)
        return "activations" if backward is not None and backward <= peak_t else None
    made_in = _phase(times, kinds, made)
    if made_in == "backward":
        ended = _next(times, kinds, made, BACKWARD_END)
        return "gradients" if ended is not None and freed > ended else "temporaries"
    if made_in == "optimizer step":
        return "temporaries"
    backward = _next(times, kinds, made, BACKWARD)
    if backward is not None and backward <= freed:
        return "activations"
    return None


def _blocks(flat: list) -> list:
    """_split_made's blocks, four ints each, as lists [size, made, freed, address]."""
    return [flat[k:k + 4] for k in range(0, len(flat), 4)]


def _gathered(parts: dict, blocks: list, held: list = (), take_held: bool = False, end_t=None):
    """Blocks made outside backward() and freed with no backward() after them: `gathered` where held
    with the oldest of them, freed no earlier than it was (less GATHERED_SLACK of its life: a graph
    frees its nodes in a cascade), `temporaries` where made later and freed sooner. Returns the
    gathered blocks' concatenation where there is one (`_joined`), else None."""
    if not blocks:
        return None
    oldest = blocks[0]
    for block in blocks:
        if block[1] < oldest[1]:
            oldest = block
    until = oldest[2] - (oldest[2] - oldest[1]) * GATHERED_SLACK
    gathered: list = []
    for block in blocks:
        if block[2] >= until:
            gathered.append(block)
            _add(parts, "gathered", block[0], block[1])
        else:
            _add(parts, "temporaries", block[0], block[1])
    for block in held:  # (still held: the result of a concatenation of gathered pieces may be)
        if block[1] > oldest[1]:
            gathered.append(block)
            if take_held:
                kept = parts["kept-tensors"]
                kept[0] -= block[0]
                kept[1] -= 1
                _add(parts, "gathered", block[0], block[1])
    if take_held and "kept-tensors" in parts and parts["kept-tensors"][1] == 0:
        del parts["kept-tensors"]
    return _joined(gathered, end_t)


def _joined(blocks: list, end_t=None):
    """The largest gathered block (the latest made of equal ones) where it is as large, within
    JOINED_SLACK, as the two or more gathered before it together: a concatenation (torch.cat, stack)
    made while its pieces were still held. {"bytes", "pieces", "pieces_bytes", "held" (still
    allocated at the reading), "address"}, or None. Blocks are [size, made, freed (end_t: not yet),
    address]."""
    result = None
    for block in blocks:
        if result is None or block[0] > result[0] or (block[0] == result[0] and block[1] > result[1]):
            result = block
    if result is None:
        return None
    pieces = 0
    pieces_bytes = 0
    for block in blocks:
        if block[1] < result[1]:
            pieces += 1
            pieces_bytes += block[0]
    if pieces < 2 or abs(pieces_bytes - result[0]) > JOINED_SLACK * result[0]:
        return None
    return {"bytes": result[0], "pieces": pieces, "pieces_bytes": pieces_bytes,
            "held": end_t is not None and result[2] >= end_t, "address": result[3]}


def _phase(times: list, kinds: list, t: int) -> str:
    """'backward', 'optimizer step' or 'outside' (a forward, an evaluation, the program's own code)."""
    i = bisect_right(times, t) - 1
    if i < 0:
        return "outside"
    kind = kinds[i]
    if kind == BACKWARD:
        return "backward"
    if kind == STEP:
        return "optimizer step"
    return "outside"


def _last(times: list, kinds: list, t: int, kind: int):
    """The time of the last mark of `kind` at or before t, or None."""
    for i in range(bisect_right(times, t) - 1, -1, -1):
        if kinds[i] == kind:
            return times[i]
    return None


def _next(times: list, kinds: list, t: int, kind: int):
    """The time of the first mark of `kind` after t, or None."""
    for i in range(bisect_right(times, t), len(times)):
        if kinds[i] == kind:
            return times[i]
    return None
