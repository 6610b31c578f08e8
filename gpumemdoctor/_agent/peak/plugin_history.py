"""PyTorch's allocation events during one `vram_limit` test of the pytest plugin, and the test's
allocated peak split by them (replay.py), for its failure message. The plugin's, not the agent's: it
runs in a test session, under `gpumemdoctor run` or not, only while a vram_limit test runs.

- Events: from the test's start, or from CUDA's start where it starts during the test (queued with
  `torch.cuda._lazy_call`, so that the plugin never starts CUDA itself), PyTorch's history records
  every allocation and free without stacks, as history.py keeps it, in a ring of CAPACITY entries.
  Where a history is on already (`torch._C._cuda_isHistoryEnabled()`: the tests' own, or the
  agent's under `gpumemdoctor run`), it is left as it is, and read from the test's start; where that
  cannot be told (a PyTorch without the call), none is turned on. After the test, one that this
  module turned on is turned off (which empties its ring).
- Marks: backward() wrapped as history.install_backward_marks wraps it, and put back after the test
  (where it is still the wrapper); the optimizer steps by PyTorch's global step pre hook, and their
  ends by `on_step`, which the plugin's step post hook calls.
  Under the agent, whose wrapper is there already, the agent's own marks are read.
- At each optimizer step's end, the optimizers' storages (`storages_of`): the latest, and those of the
  first step after the latest rise of the device's allocated peak counter (the first step after the
  peak).
- `split`: the walk back needs the test's lasting tensors alive where it starts, but after a test its
  parameters and optimizer state are freed, and the walk would call them activations (made before a
  backward, freed after one). So it starts from a moment after the peak when they were still alive
  (`peak_split`): the first step's end after the peak, with the storages read there; else the first
  end of a backward() after the peak, or the first free of a storage the optimizers held; else the
  end. There, what a backward() made and is still alive is a gradient, the storages read aside.
"""
from __future__ import annotations

import time
import weakref

from . import replay
from .history import Marks, install_backward_marks
from .reading import events_only
from ..search.blocks import py_incref
from .peak import _count

# Entries: 1.5 an allocation or free (GPT-2 124M's step makes 3,200). Measured on an H100 (torch 2.11):
# a small tensor made and freed took 7.0 us with the events on, 4.4 off; the full ring 15.1 MiB of
# host memory; reading and walking it when a test fails 0.2 s; on and off 2.5 ms. A test is no
# training loop's hot path.
CAPACITY = 100_000
ENDS = (replay.BACKWARD_END, replay.STEP_END)


class PeakHistory:
    """The events, marks and storages of one vram_limit test: `start`, `unmark` after the test,
    `split` when its peak is over the limit, then `close`. No method raises."""

    def __init__(self, torch):
        self.torch = torch
        self.start_us = time.time_ns() // 1000
        self.own = False  # a history this test turned on (turned off by close)
        self.theirs = False  # one that was on already, left as it was
        self.marks: Marks | None = Marks()
        self.own_marks = True
        self.error: str | None = None
        self.optimizers = weakref.WeakSet()  # those that stepped (a test's own, not kept alive by this)
        self.latest: dict = {}  # device index -> (time_us, storages, sizes) at the last step's end
        self.after_high: dict = {}  # ... at the first step's end after the latest rise of its peak counter
        self.counters: dict = {}
        self._queued = self._original = self._wrapper = None
        self._handles: list = []

    @classmethod
    def start(cls, torch, steps) -> "PeakHistory | None":
        """Started for a test where the tests have imported torch (`steps`: torch.optim.optimizer, where
        the global step pre hook is registered, or None; the caller's step post hook calls `on_step`);
        None where it cannot record."""
        self = cls(torch)
        try:
            cuda = torch.cuda
            if cuda.is_initialized():
                self._on()
            elif hasattr(cuda, "_lazy_call") and hasattr(cuda, "_queued_calls"):
                self._queued = self._on
                cuda._lazy_call(self._queued)
            else:
                return None
            self._mark(steps)
            return self
        except Exception:  # (a test double of torch)
            self.close()
            return None

    def _on(self) -> None:
        """The events on, unless a history is on already; also at CUDA's start, inside torch's
        _lazy_init, where an exception would fail the program's CUDA call: none leaves it."""
        try:
            enabled = getattr(self.torch._C, "_cuda_isHistoryEnabled", None)
            if enabled is None:
                return
            if enabled():
                self.theirs = True
                return
            self.torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                          max_entries=CAPACITY)
            self.own = True
        except Exception as exc:  # the cudaMallocAsync backend keeps no history
            self.error = f"{type(exc).__name__}: {exc}"[:200]

    def _mark(self, steps) -> None:
        torch = self.torch
        original = torch.autograd.backward
        if getattr(original, "__gpumemdoctor__", False):  # the agent's (gpumemdoctor run): its marks
            from .. import _current

            agent = _current()
            self.marks = agent.history.marks if agent is not None else None
            self.own_marks = False
        elif install_backward_marks(torch, self.marks) and torch.autograd.backward is not original:
            self._original, self._wrapper = original, torch.autograd.backward
        if steps is not None:
            self._handles = [steps.register_optimizer_step_pre_hook(self._pre)]

    def _pre(self, optimizer, args, kwargs) -> None:
        if self.own_marks:
            self.marks.add(replay.STEP)

    def on_step(self, optimizer, args, kwargs) -> None:
        """At each step's end (the plugin's StepWatch, one global post hook for both)."""
        try:
            now = time.time_ns() // 1000
            if self.own_marks:
                self.marks.add(replay.STEP_END)
            self.optimizers.add(optimizer)
            for index, (storages, sizes) in storages_of(list(self.optimizers)).items():
                if index < 0:
                    continue
                counter = self.torch.cuda.memory_stats_as_nested_dict(index)["allocated_bytes"]["all"]["peak"]
                reading = (now, storages, sizes)
                if counter > self.counters.get(index, -1):
                    self.after_high[index] = reading
                self.counters[index] = counter
                self.latest[index] = reading
        except Exception:  # a hook never fails the program's step
            pass

    def unmark(self) -> None:
        """After the test: backward() as it was (where the test left the wrapper), the hook removed, and
        the queued start taken back if CUDA never started."""
        try:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            if self._wrapper is not None and self.torch.autograd.backward is self._wrapper:
                self.torch.autograd.backward = self._original
            self._wrapper = None
            if self._queued is not None:
                calls = self.torch.cuda._queued_calls
                calls[:] = [c for c in calls if c[0] is not self._queued]
                self._queued = None
        except Exception:
            pass

    def close(self) -> None:
        """The history turned off where this test turned it on (and the agent has not taken it since:
        under `gpumemdoctor run` it starts at CUDA's start, as this may have)."""
        self.unmark()
        if self.own:
            self.own = False
            try:
                from .. import _current

                agent = _current()
                if agent is None or not agent.history.on:
                    self.torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass

    def split(self, index: int, counter: int) -> dict | None:
        """The test's allocated peak on device `index` (`counter`: PyTorch's peak counter) split
        (replay.replay's record), {"error": why} where it could not be, None where no events were kept."""
        if self.error:
            return {"error": self.error}
        if not (self.own or self.theirs):
            return None
        try:
            torch = self.torch
            allocated = torch.cuda.memory_allocated(index)
            traces = _traces(torch)
            kept = traces[index] if index < len(traces) else []
            trace = [e for e in kept if e["time_us"] >= self.start_us]
            full = self.own and len(kept) >= CAPACITY  # (another's ring: its size is not known; `complete` tells)
            times: list = []
            kinds: list = []
            if self.marks is not None and trace:
                self.marks.ordered(times, kinds, trace[0]["time_us"])
            readings = sorted({r[0]: r for r in (self.after_high.get(index), self.latest.get(index)) if r}.values(),
                              key=lambda r: r[0])
            found = peak_split(trace, allocated, counter, times, kinds, readings, full)
            return found if found is not None else {"error": "no allocation or free was recorded during the test"}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def storages_of(optimizers) -> dict:
    """Per device index (-1: the CPU): ({storage address: 1 parameters, 2 gradients, 3 optimizer
    state}, {address: bytes}), replay.replay's `storages` and `sizes`; each storage once, in the first
    of those it is found in (a parameter of two optimizers, state that views a parameter)."""
    params = [p for o in optimizers for group in o.param_groups for p in group["params"]]
    found = [(p, 1) for p in params] + [(p.grad, 2) for p in params if getattr(p, "grad", None) is not None]
    for o in optimizers:
        for state in list(o.state.values()):
            found += [(v, 3) for v in (list(state.values()) if isinstance(state, dict) else [])]
    out: dict = {}
    for tensor, category in found:
        try:
            index = tensor.get_device()
        except Exception:  # not a tensor (a step count kept as a number)
            continue
        storages, sizes = out.setdefault(index, ({}, {}))
        _count(tensor, index, storages, category, sizes)
    return {i: v for i, v in out.items() if v[0]}


def peak_split(trace: list, allocated: int, counter: int | None, times: list, kinds: list, readings: list,
        ring_full: bool = False) -> dict | None:
    """replay.replay's split of the peak in `trace`, walked back from a moment after it at which the
    lasting tensors were still alive (the module's docstring): `readings` are (time_us, storages, sizes)
    of the optimizers' storages, oldest first. None where the trace holds no allocation or free."""
    whole = replay.replay(trace, allocated, times, kinds, {}, {}, None, counter, ring_full)
    if whole is None or not whole["complete"]:
        return whole
    peak_us = whole["peak_time_us"]
    after = [r for r in readings if r[0] >= peak_us]
    reading = after[0] if after else (readings[-1] if readings else None)
    read_us, storages, sizes = reading if reading else (None, {}, {})
    n = len(trace)
    start = next((i for i in range(n) if trace[i]["time_us"] > peak_us), n)
    if after:  # the storages as they were then
        end_us = read_us
    else:  # the first end of a backward() or a step after the peak, or free of a storage read before it
        if read_us is not None:  # (an address freed since it was read is another block's by the peak)
            gone = {e["addr"] for e in trace[:start] if e["time_us"] > read_us and e["action"] == "free_requested"}
            storages = {a: c for a, c in storages.items() if a not in gone}
        end_us = next((times[i] for i in range(len(times)) if times[i] > peak_us and kinds[i] in ENDS), None)
        freed = next((e["time_us"] for e in trace[start:] if e["action"] == "free_requested"
                      and e["addr"] in storages), None)
        if freed is not None and (end_us is None or freed <= end_us):
            end_us = freed - 1
    k = n if end_us is None else next((i for i in range(start, n) if trace[i]["time_us"] > end_us), n)
    for e in trace[k:]:  # allocated at the cut
        if e["action"] == "alloc":
            allocated -= e["size"]
        elif e["action"] == "free_requested":
            allocated += e["size"]
    if not after:  # no storages read there: what a backward() made and is still alive at the cut, gradients
        storages = {**_made_in_backward(trace[:k], times, kinds), **storages}
    found = replay.replay(trace[:k], allocated, times, kinds, storages, sizes, None, counter, ring_full)
    return found if found is not None and found["complete"] else whole


def _made_in_backward(trace: list, times: list, kinds: list) -> dict:
    """{address: 2} of the blocks made in a backward() and alive at the trace's end: the .grad of
    leaves (and of tensors that retain it; a cuBLAS workspace first used on autograd's thread too)."""
    live: dict = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["time_us"]
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
    return {a: 2 for a, made in live.items() if replay._phase(times, kinds, made) == "backward"}


def _traces(torch) -> list:
    """Each device's recorded events: the allocator's snapshot asked for those only
    (reading.events_only: no segments, and no import of torch._dynamo where blocks carry stacks)."""
    try:
        return events_only(torch, py_incref())["device_traces"]
    except TypeError:  # a PyTorch whose snapshot takes no pool
        return torch.cuda.memory._snapshot()["device_traces"]
