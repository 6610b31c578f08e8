"""The agent's neutrality to the program's garbage collection: `Neutral`, `quiet_gc`.

The agent must not change when the program's garbage is collected. An automatic
collection starts when the count of new gc-tracked objects passes a threshold, so
reading the allocator (a nested dict from PyTorch) could set one off early. On the
program's own threads the agent holds automatic collection off while it reads
(`quiet_gc`), exactly as the program would by calling gc.disable() itself; on the
agent's own thread it never touches the collector's settings and reads only when
the count is far enough from the threshold (`Neutral.read(..., room=True)`).

Holding collection off is not enough: a reading leaves its traces in the count and in
the free lists that the program shares (PyTorch's 39 dicts per device, taken from the
dict free list or made anew, then given back to it), and those decide when the
program's later collections come. `Neutral` puts both back as it found them.
"""
from __future__ import annotations

import gc

# gc-tracked objects one reading of every device can create at most: PyTorch's nested stats
# are 39 dicts per device (measured, torch 2.11); most come from the dict free list.
GC_HEADROOM = 160


def ballast_item(a: int = 0) -> tuple:
    """One ballast: an object whose making and freeing move the collector's count by one.

    A tuple of 21 atoms: made, it raises the count as any container does; freed, it lowers it by
    one (CPython keeps no free list of tuples over 20 items). And the first collection that sees
    it stops tracking it (a tuple of atoms holds no reference cycle), so that it never joins the
    older generations, whose sizes decide when the program's full collections come (an object
    kept and tracked is counted there: 17,408 of them moved a Lightning loop's 0.3 s collection 24
    steps, issue 57), and no collection spends time on it. Measured on CPython 3.11 and 3.12
    (tests/test_neutral_ballast.py)."""
    return (a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a)


LEND_DICTS = 48  # lent to the dict free list around a reading: PyTorch's nested stats are 39
MAX_LEND = 80  # what the dict free list holds at most (CPython 3.11-3.13): more lent would be destroyed
# Made at CUDA's start with the reserve: what puts the count back after readings that leave objects on
# other free lists (a capture's few tuples, up to peak.py's 32 captures) or alive (the optimizers'
# weak references). 48 ran out on an H200 after five captures of a loop that keeps its dicts.
BALLAST = 1024


class Neutral:
    """Runs a reading so that the collector's count and the dict free list end as they began.

    Before the reading, dicts of its own reserve are lent to the free list, so that the
    reading's dicts come from it and go back to it; after, as many are taken back as
    were lent, plus any the reading had to make anew (the count says how many), less any
    the free list could not take (it was full; the count says that too). The count is
    then put back with ballast: objects without a free list, made or freed one by one.
    gc.get_count()'s own tuple comes from the free list of 3-tuples, where one of ours
    is lent too. Measured in tests/test_events.py on CPython 3.11 and 3.12: the same
    count, step by step, as a run that never read.

    `fn(arg)` must leave nothing alive. What it leaves on another type's free list (a tuple
    or a list made anew where that list was empty, as a first capture does) is paid for with
    ballast; the dicts taken back are then only those the dict free list holds, which may leave
    it short of what it held before by as many (tests/test_events.py). Ballast is made again
    from reserve dicts above MAX_LEND while the dict free list is full (`_trade`). Run it with
    automatic collection held off, or with room below the threshold (`room=True`):
    a collection in the middle would make the count meaningless.
    """

    def __init__(self, lend: int = LEND_DICTS, ballast: int = BALLAST, target: int = BALLAST):
        self.lend = lend
        self.reserve = [{} for _ in range(lend)]
        self.ballast = [ballast_item() for _ in range(ballast)]
        self.target = target  # what top_up() makes it up to, at collections' starts
        self.least = 0  # what its first top_up() makes at once (a Bulk's: all of it)
        self.t3 = (0, 0, 0)
        self.short = 0  # readings whose count could not be put back (no ballast left)
        self.collected = 0  # readings inside which a collection ran

    def read(self, fn, arg, room: bool = False):
        """fn(arg), or NO_ROOM when `room` is asked and the count is near the threshold."""
        get = gc.get_count
        self.t3 = None  # lent: gc.get_count's own tuple comes from the free list
        c0 = get()[0]
        if room and gc.isenabled():
            threshold = gc.get_threshold()[0]
            if threshold and c0 + GC_HEADROOM >= threshold:
                self.t3 = (c0, threshold, 0)
                return NO_ROOM
        reserve = self.reserve
        ballast = self.ballast
        lent = len(reserve)  # all of it: a reading that needed more dicts than were lent left them here
        if lent > MAX_LEND:
            lent = MAX_LEND
        lift = lent - c0  # the count never goes below zero: a freed dict it missed would go unseen
        while lift > 0:
            ballast.append(ballast_item())
            lift -= 1
        c1 = get()[0]
        n = lent
        while n:
            reserve.pop()  # to the free list, or freed if it is full
            n -= 1
        destroyed = c1 - get()[0]
        done = False
        try:
            result = fn(arg)
            done = True
        finally:
            created = get()[0] - c1 + destroyed if done else 0
            collected = created < 0  # a collection ran inside (one already due when the reading began)
            if collected:
                self.collected += 1
                created = 0
            n = lent - destroyed + created
            c = get()[0]
            while n > 0:
                reserve.append({})
                n -= 1
                # Where the count rose, only what the dict free list holds: the new objects may be tuples
                # or lists, on theirs. A dict made anew is kept (the ballast puts the count back).
                if created and get()[0] != c:
                    break
            c = get()[0]
            if len(reserve) > MAX_LEND and c > 0:  # (at zero a destroyed dict would not lower the count)
                _trade(reserve, ballast, get)
            if not collected:  # after a collection the count starts again from zero: nothing to put back
                c = _put_back(ballast, c, c0)
                if c > c0:
                    self.short += 1
            self.t3 = (c, c0, n)
        return result


NO_ROOM = object()


def _trade(reserve: list, ballast: list, get) -> None:
    """One dict of the reserve above its lending size turned into ballast where the free list is full:
    freed, the dict is destroyed (the count falls by one) and a ballast made in its place; where the
    free list has room, it took the dict, which is taken back. The free list and the count end as
    they began either way; the ballast a reading's own objects spent is made again over time."""
    c = get()[0]
    reserve.pop()
    if get()[0] != c:
        ballast.append(ballast_item())
    else:
        reserve.append({})


def _put_back(ballast: list, c: int, c0: int) -> int:
    """Ballast freed or made until the collector's count, now c, is c0 again; the count then (above
    c0 where the ballast ran out). Freed in one slice (each object lowers the count by one, and a
    slice's deletion makes no object): a reading that keeps a snapshot's 5,734 entries frees as many,
    0.18 ms against 0.55 one at a time on the development machine."""
    if c > c0:
        k = c - c0 if c - c0 < len(ballast) else len(ballast)
        del ballast[len(ballast) - k:]
        c -= k
    while c < c0:
        ballast.append(ballast_item())
        c += 1
    return c


TOPUP_MAX = 2048  # ballast made at a collection's start (0.46 ms on an H200 machine's host); a first: Bulk.least


def top_up(holder, most: int = TOPUP_MAX) -> int:
    """Ballast made for `holder` (a Neutral or a Bulk) up to its target, `most` at a time: how many.

    Called by the agent's collector callback at the start of a collection, where making objects
    moves nothing the program's collections depend on: the collection sets the count back to zero
    after its callbacks, and, as the youngest objects, the new ballast is looked at by this very
    collection, which stops tracking it (ballast_item). Ballast made anywhere else raises the count,
    and so brings the program's next collections early (by one young collection per 700). The agent
    therefore makes none at CUDA's start: the program's first collection makes it, and later ones
    make again what readings spent. Until then a reading may leave the count higher (`short`), and
    a bulk reading waits (Bulk.ready)."""
    ballast = holder.ballast
    need = holder.target - len(ballast)
    # A holder's first top-up makes up to its `least` at once (a Bulk's: a program may collect only
    # twice in its run, GPT-2 124M's 40 steps), later ones `most` at a time.
    least = holder.least - len(ballast)
    holder.least = 0  # (the first call only, whether it made any)
    if need <= 0:
        return 0
    if need > most:
        need = least if least > most else most
    n = need
    while n:
        ballast.append(ballast_item())
        n -= 1
    return need


class quiet_gc:
    """No automatic collection inside the block, on the program's own thread only."""

    __slots__ = ("was",)

    def __enter__(self):
        self.was = gc.isenabled()
        if self.was:
            gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()
        return False


# The count is put back with these after a bulk reading (see Bulk): each reading keeps what refilled
# the free lists it emptied (at most 80 dicts, 80 lists and 2,000 2-tuples; a snapshot of GPT-2 makes
# a few hundred 2-tuples) and pops as much ballast. BULK_SPARE must be left for a reading to start.
# A reading that keeps its snapshot's entries until a later step (reading.py) pops one a kept entry,
# and a later run that lets them go makes as many again: BULK_BALLAST holds the largest ring's.
BULK_BALLAST = 16384
BULK_SPARE = 2200
HELD_SPARE = 512  # kept with a snapshot's entries: its outer dicts and lists, the optimizers' storages
_DRAIN_LIMIT = 4096  # more than any free list holds (2-tuples: 2,000)


class Bulk:
    """Runs a reading that makes thousands of dicts, lists and 2-tuples (PyTorch's allocator
    snapshot: a dict per event and per block) so that the collector's count and those types' free
    lists end as they began. Where Neutral lends what a reading of a few dicts will take, a bulk
    reading empties every free list it touches and fills it again, so it is measured instead:
    1. each free list is drained (`{}`, `[]` and `(a, b)` taken until one is made anew, which the
       count shows): how many it held;
    2. the reading runs (collection held off by the caller): all it makes is new; what it frees
       refills the lists;
    3. the lists are drained again, and the objects of step 1 given back to them: each holds
       what it held before;
    4. what may not go back to a free list is kept (`kept`, a few hundred objects a reading), and
       the count is put back with ballast.
    `fn(arg)` must leave nothing alive that it made, but as many objects as `can_hold` allowed for
    (which a later run lets go). Checked in tests/test_neutral_bulk.py."""

    def __init__(self, ballast: int = BULK_BALLAST):
        self.ballast = [ballast_item() for _ in range(ballast)]
        self.target = BULK_BALLAST  # what top_up() makes it up to, at collections' starts
        # What its first top_up() makes at once: all of it, so that the first reading may keep its
        # snapshot for the next step (can_hold: GPT-2's ring needs 14,200) rather than pause for both
        # parts; 16,384 ballast, made once inside a collection (benchmarks/ballast_cost.py: 4.8 ms
        # added to it on an H200 machine's host, 0.46 ms for a later TOPUP_MAX).
        self.least = BULK_BALLAST
        self.kept: list = []
        self.drained: list = [[], [], []]  # made once: a holder made later would come from a free list
        self.again: list = [[], [], []]
        self.t3 = (0, 0, 0)
        self.short = 0

    def ready(self) -> bool:
        """Whether the ballast left can put the count back after one more reading."""
        return len(self.ballast) >= BULK_SPARE

    def lift(self, n: int) -> None:
        """Makes n ballast, inside a run that then lets go of about n objects an earlier run kept:
        the count rises by n first, so that their frees do not find it at zero (where CPython stops
        counting them) and the run can put it back; the ballast the earlier run spent is made again."""
        if n > 0:
            self.ballast.extend([ballast_item() for _ in range(n)])  # (the list and its frame: made and freed)

    def can_hold(self, entries: int) -> bool:
        """Whether a reading may keep `entries` objects alive after its run (reading.py's snapshot
        kept for a later step), with the ballast still ready() for the next reading."""
        return len(self.ballast) >= entries + HELD_SPARE + BULK_SPARE

    def run(self, fn, arg):
        get = gc.get_count
        self.t3 = None  # lent: gc.get_count's own tuple comes from the free list of 3-tuples
        c0 = get()[0]
        drained = self.drained
        for i in range(3):
            _drain(drained[i], get, BULK_KINDS[i])
        try:
            return fn(arg)
        finally:
            again = self.again
            kept = self.kept
            for i in range(3):
                _drain(again[i], get, BULK_KINDS[i])
            for i in range(3):
                kept.append(drained[i].pop())  # the last one drained was made anew: not a free list's
                del drained[i][:]  # back to their free lists, emptied by the second drain
                kept.extend(again[i])
                del again[i][:]
            c = _put_back(self.ballast, get()[0], c0)
            if c > c0:
                self.short += 1
            self.t3 = (c, c0, 0)


def _drain(held: list, get, make) -> int:
    """Takes `make(n)` objects into `held` until one is made anew (the collector's count moves): how
    many the free list held. gc.get_count reads the count before it makes its own 3-tuple: a first
    call puts one in that free list (where none was lent), so that the count read next is the one
    the objects move."""
    get()
    c = get()[0]
    for n in range(_DRAIN_LIMIT):
        held.append(make(n))
        if get()[0] != c:
            return n
    return _DRAIN_LIMIT


# Each kind made from its free list: a literal in the maker's own code (`dict()` would not use it); a
# tuple of variables (one of constants is a constant, made once).
BULK_KINDS = (lambda n: {}, lambda n: [], lambda n: (n, n))  # what a snapshot makes: dicts, lists, 2-tuples
# 3-tuples are left out: gc.get_count's own tuple comes from their free list, and would be counted.
CHECKED_KINDS = (*BULK_KINDS[:2], lambda n: (n,), BULK_KINDS[2], lambda n: (n, n, n, n))
_made_anew: list = []


def checked_run(bulk: Bulk, fn, arg, before: list, after: list):
    """bulk.run(fn, arg) between two measures of the free lists (into `before` and `after`, made
    beforehand) and of the collector's count: (its result, the count before, the count after). How
    Bulk is checked (tests, benchmarks/bulk_check.py); run it with collection held off."""
    free_list_lengths(before)
    c0 = gc.get_count()[0]
    result = bulk.run(fn, arg)
    c1 = gc.get_count()[0]
    free_list_lengths(after)
    return result, c0, c1


def free_list_lengths(out: list, kinds=CHECKED_KINDS) -> None:
    """How many objects each kind's free list holds (dicts, lists, 1-, 2- and 4-tuples), appended to `out`
    (made beforehand: a list made here would be one the free list no longer holds); each list is
    given back what was taken, but the one made anew, which is kept. How Bulk is checked (tests,
    benchmarks/bulk_check.py); run it with collection held off."""
    get = gc.get_count
    for make in kinds:
        held: list = []
        out.append(_drain(held, get, make))
        _made_anew.append(held.pop())
        del held[:]
