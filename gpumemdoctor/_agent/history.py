"""The allocated peak wherever it falls, between two samples too: PyTorch's allocation events kept
from CUDA's start, and read back at each new high of its allocated peak counter (replay.py says
what was live then).

- From CUDA's start (--trace auto and on), PyTorch's history records every allocation and free,
  without stacks (`enabled="all", context=None`): a ring of CAPACITY entries (address, size, time),
  which costs nothing a step can show (GPT-2 124M on an H100: 187.6 ms a step with it and without).
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
  sized to twice the events of the busiest step (MIN_CAPACITY to MAX_CAPACITY), so that the events
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
from json.encoder import encode_basestring

from . import loop_holder, main_thread, replay, saved_by
from .neutral import Bulk, quiet_gc
from .peak import new_high, place
from ..contract import ENV_SNAPSHOT

TRANSIENT_BYTES = 64 << 20  # a high that came and went since the last sample: this far above allocated now
TRANSIENT_SHARE = 0.05
MAX_READINGS = 12
# After MAX_READINGS, a high this far above the last reading's is still read, up to MORE_READINGS in
# all: a gathering loop (the Trainer's evaluation, a concatenation each batch) rises by less than
# peak.py's late share each batch, and its last high is the one that matters.
BIG_RISE = 0.15
MORE_READINGS = 24
RETRIES = 3  # readings made again because the ring did not reach back to the peak
MIN_CAPACITY = 8192  # entries: an event is 1.5 entries (alloc, free requested, free completed)
MAX_CAPACITY = 16384  # ~9 ms to read (H100); a step with more events leaves its first ones out
ENTRIES_PER_EVENT = 1.6
MARKS = 8192  # the marks' ring: four a step
NO_POOL = (1 << 60, 1 << 60)  # a memory pool id no segment has: the snapshot's events without its segments
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
    """The events kept, the marks, and the readings at new highs of the allocated peak counter."""

    def __init__(self, agent):
        self.agent = agent
        self.marks = Marks()
        self.on = False
        self.backward_marked = False
        self.capacity = MIN_CAPACITY
        self.best: list = []  # per device slot: the counter at the last reading
        self.seen: list = []
        self.events: list = []  # per device slot: allocations and frees at the last step sample
        self.busiest = 0  # most allocations and frees between two step samples
        self.readings = 0
        self.retry = None  # a device slot to read again at the next step sample (check)
        self.retries = 0
        self.asked = False
        self.pending = 0
        self.bulk: Bulk | None = None
        self.incref = None  # ctypes' Py_IncRef (see _read)
        self.callback = self.add_pending = None
        self.main_ident = threading.main_thread().ident

    def prepare(self, devices: int) -> None:
        """Made once at CUDA's start, on the program's thread."""
        self.best = [0] * devices
        self.seen = [None] * devices  # per device slot: the counter at the last sample
        self.events = [0] * devices
        self.bulk = Bulk()
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
        """The events, from CUDA's start: --trace auto and on; not with --snapshot (trace.py records
        them with stacks for its file)."""
        agent = self.agent
        if not agent.run_dir or agent.trace.mode == "off" or os.environ.get(ENV_SNAPSHOT) == "1":
            return
        error = None
        try:
            self.apply(False)
            self.on = True
        except Exception as exc:  # the cudaMallocAsync backend has no history
            error = f"{type(exc).__name__}: {exc}"[:300]
        agent.channel.write({"type": "history", "t": time.monotonic(), "ok": self.on, "error": error,
                             "capacity": self.capacity, "backward_marked": self.backward_marked})

    def apply(self, stacks: bool) -> None:
        """PyTorch's history as this module keeps it, with the live blocks' stacks (trace.py's
        windows) or without."""
        self.agent.torch.cuda.memory._record_memory_history(
            enabled="all", context="state" if stacks else None, stacks="python", max_entries=self.capacity)

    # -- at each sample ----------------------------------------------------------------
    def check(self, by: str) -> float:
        """After each sample (the sampler's lock held). Returns the thread time a reading took."""
        if not self.on or self.readings >= MORE_READINGS:
            return 0.0
        sampler = self.agent.sampler
        rows = sampler.rows
        live = sampler.live
        if by == "step":
            self.count_events(sampler)
            retry = self.retry
            if retry is not None and threading.get_ident() == self.main_ident and retry < len(rows) and live[retry]:
                # The last reading's ring did not reach back to its peak (a first step with more
                # events than the ring held): once the ring is sized to the steps, a later step's
                # events hold a peak as high, which no new high of the counter would ask for.
                self.retry = None
                started = time.thread_time()
                self.read(retry)
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
            if by == "step" and threading.get_ident() == self.main_ident:
                started = time.thread_time()
                self.read(i)  # (a step sample holds collection off)
                return time.thread_time() - started
            if not self.asked:
                self.pending = i
                self.asked = True  # before the call is queued: the main thread may run it at once
                if not main_thread.ask(self.add_pending, self.callback):
                    self.asked = False
            return 0.0
        return 0.0

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
        want = int(self.busiest * ENTRIES_PER_EVENT * 2)
        want = MIN_CAPACITY if want < MIN_CAPACITY else MAX_CAPACITY if want > MAX_CAPACITY else want
        if want > self.capacity * 1.25 or (want == MAX_CAPACITY and self.capacity < MAX_CAPACITY):
            self.capacity = want
            try:
                self.apply(self.agent.trace.on)
            except Exception:
                pass

    def _on_main_thread(self, _) -> int:
        """Between two of the main thread's bytecodes (main_thread.py). Never raises."""
        try:
            self.asked = False
            if not self.agent.finished and not main_thread.interrupted(sys._getframe(1)):
                with quiet_gc():
                    self.read(self.pending)
        except Exception:
            pass
        return 0

    def at_exit(self) -> None:
        """The exit's reading, if the counter rose past the last one (the last steps' peak)."""
        if not self.on or self.readings >= MORE_READINGS or not self.best:
            return
        sampler = self.agent.sampler
        for i in range(len(sampler.rows)):
            row = sampler.rows[i]
            # (the last chance: any high 2% above the last reading's, as at the first readings)
            if sampler.live[i] and row[6] and new_high(row[6], self.best[i], 0) and _between(row[6], row[1]):
                with quiet_gc():
                    self.read(i)
                return

    # -- a reading ---------------------------------------------------------------------
    def read(self, i: int) -> None:
        """Reads the history for device slot i and writes its `peak_history` record."""
        agent = self.agent
        bulk = self.bulk
        row = agent.sampler.rows[i]
        self.best[i] = row[6] or 0  # before the reading: one that fails is not tried again at once
        if bulk is None or not bulk.ready():
            return
        self.readings += 1
        started = time.perf_counter()
        line = bulk.run(self._read, row[0])
        spent = time.perf_counter() - started
        cost = agent.cost
        cost["history_read_s"] = cost.get("history_read_s", 0.0) + spent
        cost["history_reads"] = cost.get("history_reads", 0) + 1
        if spent > cost.get("history_read_max_s", 0.0):
            cost["history_read_max_s"] = spent
        if line:
            agent.channel.write_line(f'{line[:-1]},"elapsed_s":{spent!r}}}')

    def snapshot(self, torch) -> dict:
        """The allocator's snapshot with the events only (events_only)."""
        return events_only(torch, self.incref)

    def _read(self, index: int) -> str:
        """The snapshot and the walk back (replay.py), as one JSON line; inside neutral.Bulk: it
        leaves nothing alive that it made but the line, and makes no tuple itself."""
        agent = self.agent
        torch = agent.torch
        try:
            stats = agent.sampler.stats_fn(index)
            counter = stats["allocated_bytes"]["all"]["peak"]
            allocated = stats["allocated_bytes"]["all"]["current"]
            reserved = stats["reserved_bytes"]["all"]["current"]
            del stats
            started = time.perf_counter()
            snapshot = self.snapshot(torch)
            snapshot_s = time.perf_counter() - started
            traces = snapshot["device_traces"]
            trace = traces[index] if index < len(traces) else []
            storages: dict = {}
            sizes: dict = {}
            agent.peak_watch.optimizer_figures(index, [0, 0, 0], storages, sizes)
            figures_s = time.perf_counter() - started - snapshot_s
            times: list = []
            kinds: list = []
            self.marks.ordered(times, kinds, trace[0]["time_us"] if trace else 0)
            found = replay.replay(trace, allocated, times, kinds, storages, sizes, reserved, counter,
                                  len(trace) >= self.capacity)
            replay_s = time.perf_counter() - started - snapshot_s - figures_s
            del snapshot, traces, trace, storages, sizes, times, kinds
            freed_s = time.perf_counter() - started - snapshot_s - figures_s - replay_s
            if found is None:
                return ""
            if not found["complete"] and found["ring_full"] and self.retries < RETRIES:
                self.retries += 1
                self.retry = index  # (read again at the next step sample, when the ring holds a step)
            activations = found["parts"].get("activations")
            if activations is not None and activations["bytes"] >= saved_by.MIN_BYTES and found["complete"]:
                agent.forward_watch.arm(index)  # the modules that saved them, from the next step
            now_us = time.time_ns() // 1000
            now = time.monotonic()  # (with now_us: the two clocks read together)
            parts = ""
            for name in found["parts"]:
                p = found["parts"][name]
                item = (f'{encode_basestring(name)}:{{"bytes":{p["bytes"]},"blocks":{p["blocks"]},'
                        f'"first_before_s":{_before(p["first_us"], now_us)},'
                        f'"last_before_s":{_before(p["last_us"], now_us)}}}')
                parts = f"{parts},{item}" if parts else item
            reserved_at = found["reserved_at_peak"]
            loop = _loop_fields(torch, found["joined"])
            joined = found["joined"]
            joined = "null" if joined is None else (f'{{"bytes":{joined["bytes"]},"pieces":{joined["pieces"]},'
                                                    f'"pieces_bytes":{joined["pieces_bytes"]},'
                                                    f'"held":{_bool(joined["held"])}}}')
            return (f'{{"type":"peak_history","n":{self.readings},"t":{now!r},"step":{agent.steps},"device":{index},'
                    f'{loop},'
                    f'"counter":{counter},"allocated_peak":{found["allocated_peak"]},'
                    f'"reserved_at_peak":{"null" if reserved_at is None else reserved_at},'
                    f'"allocated":{found["allocated_now"]},"peak_before_s":{_before(found["peak_time_us"], now_us)},'
                    f'"phase":"{found["phase"]}",'
                    f'"complete":{_bool(found["complete"])},"ring_full":{_bool(found["ring_full"])},'
                    f'"events":{found["events"]},"capacity":{self.capacity},'
                    f'"backward_marked":{_bool(self.backward_marked)},"joined":{joined},"parts":{{{parts}}},'
                    f'"snapshot_s":{snapshot_s!r},"figures_s":{figures_s!r},"replay_s":{replay_s!r},'
                    f'"freed_s":{freed_s!r}}}')
        except Exception as exc:
            return (f'{{"type":"peak_history","n":{self.readings},"t":{time.monotonic()!r},"device":{index},'
                    f'"error":{encode_basestring(f"{type(exc).__name__}: {exc}"[:200])}}}')


# Library loops that gather a model's outputs on the GPU, whose own switches say how not to:
# (file's ending, function) -> the name a reading records (diagnosis/allocated_peak.py has the remedy).
LIBRARY_LOOPS = {(os.path.join("transformers", "trainer.py"), "evaluation_loop"): "transformers.Trainer.evaluation_loop",
                 (os.path.join("transformers", "trainer.py"), "prediction_loop"): "transformers.Trainer.prediction_loop"}


def _loop_fields(torch, joined) -> str:
    """The reading's `loop`, `loop_called_at` and `loop_holder` (what holds a concatenation's result
    still held in the loop, with the library's line: loop_holder.py), as JSON fields."""
    loop, called, frame = loop_of(sys._getframe(1))
    holder = None
    if frame is not None and joined is not None and joined["held"]:
        holder = loop_holder.holder(torch.Tensor, torch.nn.Parameter, sys._getframe(), frame, joined["address"])
    del frame
    return (f'"loop":{"null" if loop is None else encode_basestring(loop)},'
            f'"loop_called_at":{"null" if called is None else encode_basestring(called)},'
            f'"loop_holder":{"null" if holder is None else encode_basestring(holder)}')


def loop_of(frame) -> tuple:
    """The library loop (LIBRARY_LOOPS) the main thread is in when a reading is made there, the
    program's line that called it (outside the loop: a callback the loop calls is the program's too)
    and the loop's frame; (None, None, None) outside one."""
    depth = 0
    while frame is not None and depth < 200:
        code = frame.f_code
        for key in LIBRARY_LOOPS:
            if code.co_name == key[1] and code.co_filename.endswith(key[0]):
                return LIBRARY_LOOPS[key], place(frame.f_back)[0], frame
        frame = frame.f_back
        depth += 1
    return None, None, None


def py_incref():
    """ctypes' Py_IncRef, for events_only."""
    import ctypes

    incref = ctypes.pythonapi.Py_IncRef
    incref.argtypes = [ctypes.py_object]
    incref.restype = None
    return incref


def events_only(torch, incref) -> dict:
    """PyTorch's allocator snapshot with the events only: a pool no segment belongs to (NO_POOL)
    leaves the segments out. Their blocks may carry stacks (trace.py's windows), whose first reading
    in a process imports torch._dynamo (6 s on an H100 machine) where the program has not. PyTorch
    2.11 takes the pool id's two items as its own references and lets them go (a second call with the
    same tuple then read freed ints: "mempool_id elements must be integers", then a crash): each call
    first gives it the references it will drop (`incref`: py_incref())."""
    incref(NO_POOL[0])
    incref(NO_POOL[1])
    return torch._C._cuda_memorySnapshot(NO_POOL)


def _worth(counter: int, best: int, readings: int) -> bool:
    """Whether the counter's high is worth a reading over the last one's (`best`)."""
    if not new_high(counter, best, readings):
        return False
    return readings < MAX_READINGS or counter >= best * (1 + BIG_RISE)


def _between(counter: int, allocated) -> bool:
    """Whether the counter's high came and went between two readings: it is above what is allocated
    now by TRANSIENT_BYTES and TRANSIENT_SHARE of it."""
    return allocated is not None and counter - allocated >= max(TRANSIENT_BYTES, TRANSIENT_SHARE * counter)


def _before(us, now_us: int) -> str:
    """How long before the reading a history time (Unix microseconds) was, in seconds, or null: the
    recording's clock is another, and the reading's `t` is on it."""
    return "null" if us is None else repr(max(0.0, (now_us - us) / 1e6))


def _bool(value) -> str:
    return "true" if value else "false"
