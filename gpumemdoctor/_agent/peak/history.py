"""The allocated peak wherever it falls, between two samples too: PyTorch's allocation events kept
from CUDA's start, and read back at each new high of its allocated peak counter (replay.py says
what was live then).

- From CUDA's start (--trace auto and on), PyTorch's history records every allocation and free,
  without stacks (`enabled="all", context=None`, and without the entries no walk reads: SKIPPED): a
  ring of entries (address, size, time), which costs nothing a step can show (GPT-2 124M on an H100:
  187.6 ms a step with it and without).
  trace.py's windows record the live blocks' stacks on top (`context="state"`), not the events'.
- Marks: when each backward() and each optimizer step begins and ends (`torch.autograd.backward`
  wrapped, same name, signature and result; PyTorch's global optimizer step hooks), in arrays made
  once. They tell an activation from a temporary (replay.py).
- At a sample where PyTorch's allocated peak counter has risen past the last reading's (peak.new_high) to a
  high that has gone again (TRANSIENT: the sample's own reading has a high that is still there), the
  history is read: PyTorch's allocator snapshot, on the program's main thread (at a step boundary,
  or between two of its bytecodes when the timer saw it), through neutral.Bulk with automatic
  collection held off, so that the program's collections come when they would have. The snapshot is
  asked for the events only (a pool no segment has: blocks with stacks would make its first call
  import torch._dynamo, 4-7 s); with its segments, 2.3 ms with 5,000 events (GPT-2's step makes
  3,200) and 0.45 us an event more; the ring is
  sized to twice the events of the busiest step (MIN_EVENTS to MAX_EVENTS), so that the events
  since the forward that led to the peak are still there. A `peak_history` record says what was
  live at the highest moment, and its cost.
- A new high as peak.py's captures have one (`new_high`); at most MAX_READINGS in a process, then
  MORE_READINGS for highs BIG_RISE above the last reading's; a smaller rise is read once it has stayed
  a sample (a gathering loop's last concatenation). A high seen at a sample itself is read at a later
  one, once gone; a reading whose full ring missed its peak is made again at the next step samples
  (RETRIES). None with --snapshot (its events carry stacks: a reading would be slow).
"""
from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from array import array

from . import reading, replay
from .. import main_thread
from ..readings.felt import HISTORY_READ, count_since
from ..search.blocks import py_incref
from ..neutral import BULK_BALLAST, Bulk, quiet_gc
from .peak import new_high
from .saved_by import AT_STEP_END
from ...contract import ENV_SNAPSHOT

TRANSIENT_BYTES = 64 << 20  # a high that came and went since the last sample: this far above allocated now
TRANSIENT_SHARE = 0.05
MAX_READINGS = 12
# After MAX_READINGS, a high this far above the last reading's is still read, up to MORE_READINGS in
# all: a gathering loop (the Trainer's evaluation, a concatenation each batch) rises by less than
# peak.py's late share each batch, and its last high is the one that matters.
BIG_RISE = 0.15
MORE_READINGS = 24
# The ring, in allocations and frees (events): twice the busiest step's, within these bounds. A
# reading costs per entry (H100, torch 2.11: the snapshot 0.6-1.2 us, the walk 0.5 us, freeing it
# 0.2 us), and an event is one entry where PyTorch can skip the entries no walk reads (SKIPPED), 1.5
# where it cannot (a free's request and its completion).
MIN_EVENTS = 5461  # an evaluation between two steps: more events than any step count foresees
MAX_EVENTS = 10922  # a step with more events leaves its first ones out
SKIPPED = ["free_completed", "snapshot"]  # (a free lowers allocated memory at its request)
ENTRIES_PER_EVENT = (1.6, 1.05)  # without SKIPPED, with it (segments' entries, an out-of-memory's)
MARKS = 8192  # the marks' ring: four a step
# A walk put off goes on at each step sample for this long (replay.Walk: it looks at the clock every
# CHUNK entries), so that no step pauses for a whole walk: GPT-2 124M's took 4.4 ms at one step on an
# H200 (3.1 ms the walk back, 1.3 ms letting the snapshot go), 2026-12-03.
WALK_SLICE_S = 0.0005
# ... but not at a step sample whose gap the agent has already paused this long (felt.py: its other
# watches at this sample, a timer's samples during the step), up to WALK_SKIPS such samples in a row.
WALK_BUSY_S = 0.001
WALK_SKIPS = 8
BACKWARD_PARAMETERS = ["tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs"]


class Marks:
    """When backward() and optimizer steps began and ended: two arrays made once, written in place."""

    def __init__(self):
        self.times = array("q", bytes(8 * MARKS))
        self.kinds = array("b", bytes(MARKS))
        self.n = 0

    def add(self, kind: int) -> None:
        i = self.n % MARKS
        self.times[i] = time.time_ns() // 1000  # the history's own clock: Unix time in microseconds
        self.kinds[i] = kind
        self.n += 1

    def ordered(self, times: list, kinds: list, since: int) -> None:
        """The marks from the last one before `since` (Unix microseconds) on, oldest first, into the
        two lists (one written out of order is left out)."""
        n = self.n
        last = None
        for j in range(n - 1, (n - MARKS if n > MARKS else 0) - 1, -1):
            i = j % MARKS
            t = self.times[i]
            if last is not None and t > last:
                continue
            times.append(t)
            kinds.append(self.kinds[i])
            last = t
            if t < since:  # it tells what part of a step the first events fell in
                break
        times.reverse()
        kinds.reverse()


def install_backward_marks(torch, marks: Marks) -> bool:
    """torch.autograd.backward (which Tensor.backward calls) wrapped to mark its beginning and end,
    where its parameters are the ones this wrapper passes on; False where they are not."""
    original = torch.autograd.backward
    if getattr(original, "__gpumemdoctor__", False):
        return True
    try:
        parameters = inspect.signature(original).parameters
    except (TypeError, ValueError):
        return False
    if list(parameters) != BACKWARD_PARAMETERS or any(
            p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters.values()):
        return False

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                 inputs=None):
        marks.add(replay.BACKWARD)
        try:
            return original(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
        finally:
            marks.add(replay.BACKWARD_END)

    for name in ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"):
        try:
            setattr(backward, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    backward.__wrapped__ = original
    backward.__gpumemdoctor__ = True
    torch.autograd.backward = backward
    return True


class History:
    """The marks, the events' ring (Ring), and the readings at new highs of the allocated peak counter."""

    def __init__(self, shared, sampler, trace, peak_watch):
        self.shared = shared
        self.sampler = sampler
        self.trace = trace  # the stacks: the ring's setting follows them
        self.peak_watch = peak_watch  # the optimizers' figures, in each reading (reading.py)
        self.forward_watch = None  # saved_by.ForwardWatch, which reads this history: core sets it
        self.marks = Marks()
        self.ring = Ring(shared, trace)  # its setting and size
        self.on = False
        self.backward_marked = False
        self.best: list = []  # per device slot: the counter at the last reading
        self.seen: list = []
        self.readings = 0
        self.retry = None  # a device slot to read again at the next step sample (check)
        self.retries = 0
        self.asked = False
        self.pending = 0
        self.bulk: Bulk | None = None
        self.incref = None  # ctypes' Py_IncRef (reading.events_only)
        self.taken = None  # a reading whose walk was put off to a later step's sample (reading.take)
        self.walk_at = 0  # ... at the first step sample once the program has made this many steps
        self.walked_s = 0.0  # the parts of that walk so far
        self.taken_s = 0.0  # ... and its first part's, once it is done
        self.skipped = 0  # step samples in a row that made no part of it (WALK_BUSY_S)
        self.callback = self.add_pending = None
        self.main_ident = threading.main_thread().ident

    def prepare(self, devices: int) -> None:
        """Made once at CUDA's start, on the program's thread."""
        self.best = [0] * devices
        self.ring.events = [0] * devices
        self.seen = [None] * devices  # per device slot: the counter at the last sample
        self.bulk = Bulk(ballast=0 if self.shared.run_dir else BULK_BALLAST)  # (as the sampler's: neutral.top_up)
        self.callback, self.add_pending = main_thread.pending_call(self._on_main_thread)
        try:
            self.incref = py_incref()
        except Exception:
            self.bulk = None  # no readings: the snapshot's call could not be made safe

    def install(self, torch) -> None:
        """The marks, when torch is imported (under `run` only)."""
        try:
            self.backward_marked = install_backward_marks(torch, self.marks)
        except Exception:
            self.backward_marked = False

    def start(self) -> None:
        """The events, from CUDA's start: --trace auto and on; not with --snapshot (trace.py's, with stacks)."""
        shared = self.shared
        if not shared.run_dir or self.trace.mode == "off" or os.environ.get(ENV_SNAPSHOT) == "1":
            return
        error = None
        try:
            self.ring.apply(False)
            self.on = True
        except Exception as exc:  # the cudaMallocAsync backend has no history
            error = f"{type(exc).__name__}: {exc}"[:300]
        shared.channel.write({"type": "history", "t": time.monotonic(), "ok": self.on, "error": error,
                              "capacity": self.ring.capacity, "backward_marked": self.backward_marked})

    # -- at each sample ----------------------------------------------------------------
    def check(self, now: float, by: str) -> float:
        """After each sample (the sampler's lock held). Returns the thread time a reading took."""
        if not self.on:
            return 0.0
        on_main = threading.get_ident() == self.main_ident
        sampler = self.sampler
        if by == "step":
            self.ring.count_events(sampler)  # (each step's, also while a walk waits: the ring's size)
            if self.forward_watch.state in AT_STEP_END:
                # This step's end reads the module-hooked step (saved_by.py): a walk put off, a retry or a
                # new high waits a step, one part a step (the ring holds two steps' events).
                return 0.0
        if self.taken is not None:
            # A walk put off is made at later steps' samples, WALK_SLICE_S at each, before any reading.
            if by == "step" and on_main and self.shared.steps >= self.walk_at:
                if self.skipped < WALK_SKIPS and _busy(self.shared.felt) > WALK_BUSY_S:
                    self.skipped += 1
                    return 0.0
                self.skipped = 0
                started = time.thread_time()
                self.advance()
                return time.thread_time() - started
            if by == "step":
                return 0.0
        if self.readings >= MORE_READINGS:
            return 0.0
        if self.bulk is None or not self.bulk.ready():
            return 0.0  # no reading can be made yet (read() says why): no high is asked for or taken
        rows = sampler.rows
        live = sampler.live
        if by == "step":
            retry = self.retry
            if retry is not None and on_main and retry < len(rows) and live[retry]:
                # The last reading's ring did not reach back to its peak (a first step with more
                # events than the ring held): once the ring is sized to the steps, a later step's
                # events hold a peak as high, which no new high of the counter would ask for.
                self.retry = None
                started = time.thread_time()
                self.read(retry, self.shared.steps + 1)
                return time.thread_time() - started
        for i in range(len(rows)):
            if not live[i]:
                continue
            row = rows[i]
            counter = row[6]
            best = self.best[i]
            # A high that stayed since the last sample is read once it is 2% above the last reading's:
            # the counter has stopped rising (a gathering loop's last concatenation, whose rise was
            # too small for `_worth` at the time), and the program still holds what it held then.
            settled = counter is not None and counter == self.seen[i] and new_high(counter, best, 0)
            self.seen[i] = counter
            if counter is None or not (settled or _worth(counter, best, self.readings)):
                continue
            if not _between(counter, row[1]):
                # The high is now: the sample's own capture (peak.py) has it, without a split; a
                # later sample reads it once it has gone (the counter is not taken as read).
                continue
            if by == "step" and on_main:
                started = time.thread_time()
                self.read(i, self.shared.steps + 1)  # (a step sample holds collection off)
                return time.thread_time() - started
            if not self.asked:
                self.pending = i
                self.asked = True  # before the call is queued: the main thread may run it at once
                if not main_thread.ask(self.add_pending, self.callback):
                    self.asked = False
            return 0.0
        return 0.0

    def _on_main_thread(self, _) -> int:
        """Between two of the main thread's bytecodes (main_thread.py). Never raises."""
        started = time.perf_counter()
        try:
            self.asked = False
            if not self.shared.finished and not main_thread.interrupted(sys._getframe(1)):
                steps = self.shared.steps  # (in the middle of a step: its walk after the next one)
                with quiet_gc():
                    self.read(self.pending, steps + 2 if steps else 0)
                count_since(self.shared.felt, HISTORY_READ, started)
        except Exception:
            pass
        return 0

    def at_exit(self) -> None:
        """The exit's reading if the counter rose past the last one (the last steps' peak), after a walk put off."""
        if self.taken is not None:
            with quiet_gc():
                self.finish()
        if not self.on or self.readings >= MORE_READINGS or not self.best:
            return
        sampler = self.sampler
        for i in range(len(sampler.rows)):
            row = sampler.rows[i]
            # (the last chance: any high 2% above the last reading's, as at the first readings)
            if sampler.live[i] and row[6] and new_high(row[6], self.best[i], 0) and _between(row[6], row[1]):
                with quiet_gc():
                    self.read(i)
                return

    # -- a reading (reading.py) ----------------------------------------------------------
    def read(self, i: int, walk_at: int = 0) -> None:
        """Device slot i's snapshot, then its walk and record at once or at the first step sample
        once `walk_at` steps are made, where the ballast can hold its entries (Bulk.can_hold) and no
        library loop runs (its holder is read at the walk). A walk put off before is made first."""
        shared = self.shared
        bulk = self.bulk
        row = self.sampler.rows[i]
        if self.taken is not None:
            self.finish()
        if bulk is None or not bulk.ready():
            # Not read, and the high not taken as read: it waits for the ballast, which the first
            # collections make (neutral.top_up). Taken as read here, a high that never rose again
            # would never be read (GPT-2 124M on an H200: no reading in 40 steps, the peak unsplit).
            return
        self.best[i] = row[6] or 0  # before the reading: one that fails is not tried again at once
        self.readings += 1
        started = time.perf_counter()
        if not walk_at or not bulk.can_hold(self.ring.capacity):
            line = bulk.run(self._whole, row[0])  # (the device's torch index)
            spent = time.perf_counter() - started
            _count(self.shared.cost, spent, 1)
            _record(shared.channel, line, spent)
            return
        taken = bulk.run(self._take, row[0])
        spent = time.perf_counter() - started
        _count(self.shared.cost, spent, 1)
        if type(taken) is str:  # (the error's record)
            _record(shared.channel, taken, spent)
            return
        taken[reading.TAKEN_S] = spent
        self.taken = taken
        self.walk_at = walk_at
        if taken[reading.LOOP] is not None:
            self.finish()

    def advance(self) -> None:
        """A part of the walk put off, as long as WALK_SLICE_S allows (where the ballast left can
        keep what the walk holds between two parts: else the rest at once); its record once done."""
        self._part(WALK_SLICE_S if self.bulk.can_hold(0) else None)

    def finish(self) -> None:
        """The rest of the walk put off (reading.walk) at once, and its record."""
        self._part(None)

    def _part(self, slice_s) -> None:
        """The walk put off, for `slice_s` (None: to its end); where it ends, its record, with the time
        of both parts (the walk's over all the steps it took)."""
        started = time.perf_counter()
        line = self.bulk.run(self._walk_part, None if slice_s is None else started + slice_s)
        spent = time.perf_counter() - started
        _count(self.shared.cost, spent)
        self.walked_s += spent
        if line is not None:
            _record(self.shared.channel, line, self.taken_s + self.walked_s)
            self.walked_s = 0.0

    def snapshot(self, torch) -> dict:
        """The allocator's snapshot with the events only (saved_by.py's reading too)."""
        return reading.events_only(torch, self.incref)

    def _take(self, index: int):
        return reading.take(self, index, True)

    def _walk_part(self, deadline):
        line = reading.walk(self, self.taken, True, deadline)
        if line is not None:  # done: the list let go inside the Bulk run, as all the reading made
            self.taken_s = self.taken[reading.TAKEN_S]
            self.taken = None
        return line

    def _whole(self, index: int) -> str:
        """Both parts in one run (reading.py)."""
        taken = reading.take(self, index)
        return taken if type(taken) is str else reading.walk(self, taken, False)



class Ring:
    """PyTorch's history as this module keeps it: the events, with the live blocks' stacks or without,
    in a ring sized to twice the busiest step's events (MIN_EVENTS to MAX_EVENTS)."""

    def __init__(self, shared, trace):
        self.shared = shared
        self.trace = trace  # the stacks on or off: a new size keeps them as they are
        self.skips = True  # whether PyTorch takes skip_actions (2.11 and 2.13 do): entries no walk reads
        self.capacity = capacity(MIN_EVENTS, True)
        self.events: list = []  # per device slot: allocations and frees at the last step sample
        self.busiest = 0  # most allocations and frees between two step samples

    def apply(self, stacks: bool) -> None:
        """PyTorch's history as this module keeps it, with the live blocks' stacks (trace.py) or without."""
        record = self.shared.torch.cuda.memory._record_memory_history
        context = "state" if stacks else None
        if self.skips:
            try:
                record(enabled="all", context=context, stacks="python", max_entries=self.capacity,
                       skip_actions=SKIPPED)
                return
            except TypeError:  # an older PyTorch: every action is recorded, 1.5 entries an event
                self.skips = False
                self.capacity = int(self.capacity / ENTRIES_PER_EVENT[1] * ENTRIES_PER_EVENT[0])
        record(enabled="all", context=context, stacks="python", max_entries=self.capacity)

    def count_events(self, sampler) -> None:
        """The allocations and frees since the last step sample: the busiest step's size the ring."""
        for i in range(len(self.events)):
            events = sampler.events[i]
            if events is None or not sampler.live[i]:
                continue
            if self.events[i] and events - self.events[i] > self.busiest:
                self.busiest = events - self.events[i]
                self.resize()
            self.events[i] = events

    def resize(self) -> None:
        events = self.busiest * 2
        events = MIN_EVENTS if events < MIN_EVENTS else MAX_EVENTS if events > MAX_EVENTS else events
        want = capacity(events, self.skips)
        most = capacity(MAX_EVENTS, self.skips)
        if want > self.capacity * 1.25 or (want == most and self.capacity < most):
            self.capacity = want
            try:
                self.apply(self.trace.on)
            except Exception:
                pass

    def holds(self, events: int) -> bool:  # whether the ring, sized as it is now, holds these events
        return capacity(events, self.skips) <= self.capacity


def capacity(events: int, skips: bool) -> int:
    """The ring's entries that hold `events` allocations and frees."""
    return int(events * ENTRIES_PER_EVENT[1 if skips else 0])


def _record(channel, line: str, elapsed: float) -> None:
    """A reading's `peak_history` line (none where its events held no allocation), with the time the
    program paused for it in all."""
    if line:
        channel.write_line(f'{line[:-1]},"elapsed_s":{elapsed!r}}}')


def _count(cost: dict, spent: float, reads: int = 0) -> None:
    """A pause of the program's for a reading (its first part: `reads` 1), in the agent's costs."""
    cost["history_reads"] = cost.get("history_reads", 0) + reads
    cost["history_read_s"] = cost.get("history_read_s", 0.0) + spent
    if spent > cost.get("history_read_max_s", 0.0):
        cost["history_read_max_s"] = spent  # (the longest)


def _busy(felt) -> float:
    """What the agent has paused the program for since the last step's end (felt.py), in seconds."""
    return 0.0 if felt is None else sum(felt.since_end.parts)


def _worth(counter: int, best: int, readings: int) -> bool:
    """Whether the counter's high is worth a reading over the last one's (`best`)."""
    if not new_high(counter, best, readings):
        return False
    return readings < MAX_READINGS or counter >= best * (1 + BIG_RISE)


def _between(counter: int, allocated) -> bool:
    """Whether the counter's high came and went between two readings: it is above what is allocated
    now by TRANSIENT_BYTES and TRANSIENT_SHARE of it."""
    return allocated is not None and counter - allocated >= max(TRANSIENT_BYTES, TRANSIENT_SHARE * counter)
