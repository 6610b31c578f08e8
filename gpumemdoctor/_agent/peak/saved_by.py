"""What saved a step's activations: the modules whose forward made them, and the program's line that
called the forward. The allocator's events carry no stacks (history.py), so one step is recorded
with PyTorch's global module hooks, once, after a reading found activations at the allocated peak.

- Armed by history.py's reading when its activations are MIN_BYTES or more. At the next optimizer
  step's end (core.on_step, on the program's thread) the global forward pre- and post-hooks are
  registered (`register_module_forward_pre_hook`, `register_module_forward_hook(always_call=True)`);
  at the step's end after, they are removed. In the one step between, every module call takes
  `Module._call_impl`'s full path (a few microseconds a call; a transient closure and set a call, which
  the collector's count sees come and go).
- Never where torch.compile has compiled a frame (hooks added and removed would make it recompile:
  seconds), nor twice in a process.
- The hooks write each forward's beginning and end (the history's clock: Unix microseconds), the
  module's id and +1 or -1 into arrays made once; the program's main thread only. The first forward
  entered with none running gives the line: the first frame outside torch and installed libraries
  (else outside torch).
- At that step's end, after the hooks are gone, its events are read (one snapshot through
  neutral.Bulk, as history.py reads them) and `attribute` (pure) gives each block made before the
  step's backward() and freed while it ran (an activation, as replay.py tells them) to the innermost
  module running when it was made. Modules are named from the roots' named_modules(), a repeated
  block's index folded (`transformer.h.3.attn` -> `transformer.h[*].attn`) and summed up to a
  repeated block's child (`group`). One `forward_modules` record.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time
from array import array
from json.encoder import encode_basestring

from .replay import BACKWARD, BACKWARD_END

MIN_BYTES = 64 << 20  # activations at a reading's peak that make the step worth recording
CAPACITY = 65536  # forward beginnings and ends in the recorded step (GPT-2 124M: about 330)
MAX_ROOTS = 8  # modules called with no other running (a model, its loss, an EMA copy)
TOP = 8  # the modules a record names
IDLE, ARMED, RECORDING, DONE, READ_NEXT = 0, 1, 2, 3, 4
AT_STEP_END = (RECORDING, READ_NEXT)  # the states in which a step's end reads the recorded step
# A step's end that has already paused the program this long (its sample's readings and probes) reads
# the recorded step at the next step's end instead (the reading takes 4-7 ms on GPT-2 and ResNet-50;
# a step's whole pause stays within 10 ms), where the allocator's ring still holds it.
BUSY_S = 0.003
LIBRARY_DIRS = ("site-packages", "dist-packages")


class ForwardWatch:
    def __init__(self, shared, history, sampler):
        self.shared = shared
        self.history = history  # its ring holds the hooked step's events; its ballast the reading's
        self.sampler = sampler
        self.state = IDLE
        self.times = array("q", bytes(8 * CAPACITY))
        self.ids = array("q", bytes(8 * CAPACITY))
        self.kinds = array("b", bytes(CAPACITY))
        self.n = 0
        self.depth = 0
        self.full = False
        self.roots: list = [None] * MAX_ROOTS
        self.where: list = [None, 0, None, None, 0, None]  # the program's frame, then the first outside torch
        self.handles: list = [None, None]
        self.since_us = 0
        self.events0: int | None = None  # the device's allocations and frees when the recording began
        self.step = 0
        self.device = 0
        self.torch_dir = ""
        self.main_ident = threading.main_thread().ident
        self.why_not = None

    def arm(self, device: int) -> None:
        """A reading found activations worth naming (history.py)."""
        if self.state == IDLE:
            self.state = ARMED
            self.device = device

    def at_step(self, spent_s: float = 0.0) -> None:
        """At each optimizer step's end, on the program's thread (core.on_step); `spent_s`: what
        the agent has already paused the program for at this step's end."""
        state = self.state
        if state == ARMED:
            self._start()
        elif state == RECORDING:
            if spent_s > BUSY_S and self._ring_holds_another_step():
                self.state = READ_NEXT
                self._remove()  # the recorded step is the one that ended: its reading waits a step
                return
            self._stop()
        elif state == READ_NEXT:
            self._stop()

    def _ring_holds_another_step(self) -> bool:
        """Whether the allocator's ring will still hold the recorded step's events after one more step
        like it (with room to spare): the events counted since the recording began, from the samples."""
        now = self._events()
        return now is not None and self.events0 is not None and self.history.ring.holds((now - self.events0) * 5 // 2)

    def _start(self) -> None:
        shared = self.shared
        torch = shared.torch
        self.state = DONE  # (whatever happens next: never twice)
        if _compiled():
            self.why_not = "torch.compile had compiled frames"
            return
        bulk = self.history.bulk
        if bulk is None or not bulk.ready():
            return
        try:
            from torch.nn.modules import module
            self.torch_dir = os.path.dirname(torch.__file__) + os.sep
            c0 = _count()
            self.handles[0] = module.register_module_forward_pre_hook(self._pre)
            try:
                self.handles[1] = module.register_module_forward_hook(self._post, always_call=True)
            except TypeError:  # (before always_call: a forward that raises leaves its end unwritten)
                self.handles[1] = module.register_module_forward_hook(self._post)
            _put_back(bulk, c0)  # the handles made here stay: the count as it was
        except Exception:
            self._remove()
            return
        self.since_us = time.time_ns() // 1000
        self.step = shared.steps
        self.events0 = self._events()
        self.state = RECORDING

    def _events(self) -> int | None:
        """The device's allocations and frees so far, as the last sample counted them."""
        sampler = self.sampler
        for i in range(len(sampler.rows)):
            if sampler.rows[i][0] == self.device:
                return sampler.events[i]
        return None

    def _stop(self) -> None:
        self.state = DONE
        self._remove()
        bulk = self.history.bulk
        try:
            if bulk is None or not bulk.ready():
                return
            started = time.perf_counter()
            line = bulk.run(self._read, self.device)
            spent = time.perf_counter() - started
        finally:
            roots = self.roots
            for i in range(MAX_ROOTS):  # the program's models are its own to let go of
                roots[i] = None
        self.shared.cost["forward_modules_s"] = spent  # (one reading in a process: the program's pause)
        if line:
            self.shared.channel.write_line(f'{line[:-1]},"elapsed_s":{spent!r}}}')

    def _remove(self) -> None:
        bulk = self.history.bulk
        c0 = _count()
        for i in range(2):
            handle = self.handles[i]
            self.handles[i] = None
            if handle is not None:
                try:
                    handle.remove()
                except Exception:
                    pass
        if bulk is not None:
            _put_back(bulk, c0)

    # -- the hooks: arrays written in place, nothing the collector tracks made --------------
    def _pre(self, module, args):
        if threading.get_ident() != self.main_ident:
            return None
        self._write(module, 1)
        if self.depth == 0:
            self._root(module)
        self.depth += 1
        return None

    def _post(self, module, args, output):
        if threading.get_ident() != self.main_ident:
            return None
        self._write(module, -1)
        if self.depth > 0:
            self.depth -= 1
        return None

    def _write(self, module, kind: int) -> None:
        n = self.n
        if n < CAPACITY:
            self.times[n] = time.time_ns() // 1000
            self.ids[n] = id(module)
            self.kinds[n] = kind
            self.n = n + 1
        else:
            self.full = True

    def _root(self, module) -> None:
        roots = self.roots
        for i in range(MAX_ROOTS):
            if roots[i] is module:
                break
            if roots[i] is None:
                roots[i] = module
                break
        where = self.where
        if where[0] is not None or where[3] is not None:
            return
        frame = sys._getframe(2)
        depth = 0
        while frame is not None and depth < 64:
            filename = frame.f_code.co_filename
            if not filename.startswith(self.torch_dir):
                if where[3] is None:
                    where[3] = filename
                    where[4] = frame.f_lineno
                    where[5] = frame.f_code.co_name
                if LIBRARY_DIRS[0] not in filename and LIBRARY_DIRS[1] not in filename:
                    where[0] = filename
                    where[1] = frame.f_lineno
                    where[2] = frame.f_code.co_name
                    return
            frame = frame.f_back
            depth += 1

    # -- the reading ---------------------------------------------------------------------
    def _head(self, index: int) -> str:
        """A record's first fields: the recorded step, and the step whose end read it (the next one
        where that step's end was busy)."""
        return (f'{{"type":"forward_modules","t":{time.monotonic()!r},"step":{self.step},'
                f'"read_step":{self.shared.steps},"device":{index},')

    def _read(self, index: int) -> str:
        """The recorded step's events, its activations by module, as one JSON line (inside Bulk)."""
        shared = self.shared
        history = self.history
        try:
            started = time.perf_counter()
            snapshot = history.snapshot(shared.torch)
            traces = snapshot["device_traces"]
            trace = traces[index] if index < len(traces) else []
            if trace and trace[0]["time_us"] > self.since_us:
                del snapshot, traces, trace
                return self._head(index) + '"error":"the allocator\'s ring no longer held the recorded step\'s start"}'
            times: list = []
            kinds: list = []
            history.marks.ordered(times, kinds, self.since_us)
            found = attribute(trace, self.since_us, times, kinds, self.times, self.ids, self.kinds, self.n)
            del snapshot, traces, trace, times, kinds
            snapshot_s = time.perf_counter() - started
            if found is None:
                return self._head(index) + '"error":"no backward() in the recorded step"}'
            names: dict = {}
            for root in self.roots:
                if root is not None:
                    _name(root, found["modules"], names)
            groups: dict = {}
            for key in found["modules"]:
                r = found["modules"][key]
                name = group(names.get(key, "?"))
                g = groups.get(name)
                if g is None:
                    groups[name] = g = [0, 0]
                g[0] += r[0]
                g[1] += r[1]
            ordered = sorted(groups, key=groups.get, reverse=True)  # (lists compare by bytes first)
            modules = ""
            for name in ordered[:TOP]:
                g = groups[name]
                item = f'{{"name":{encode_basestring(name)},"bytes":{g[0]},"blocks":{g[1]}}}'
                modules = f"{modules},{item}" if modules else item
            rest = 0
            for name in ordered[TOP:]:
                rest += groups[name][0]
            where = self.where
            line = "null" if where[0] is None and where[3] is None else (
                f'{{"file":{encode_basestring(where[0] or where[3])},"line":{where[1] or where[4]},'
                f'"function":{encode_basestring(where[2] or where[5] or "")}}}')
            return (self._head(index) +
                    f'"activations":{found["total"]},"outside_modules":{found["outside"]},"rest":{rest},'
                    f'"forwards":{self.n},"full":{"true" if self.full else "false"},"line":{line},'
                    f'"modules":[{modules}],"snapshot_s":{snapshot_s!r}}}')
        except Exception as exc:
            return self._head(index) + f'"error":{encode_basestring(f"{type(exc).__name__}: {exc}"[:200])}}}'


def attribute(trace: list, since_us: int, times: list, kinds: list, m_times, m_ids, m_kinds, n: int) -> dict | None:
    """The activations of the first backward() after `since_us` (blocks made before it began, freed
    while it ran), each given to the innermost module running when it was made: {"modules": {id:
    [bytes, blocks]}, "outside": bytes made with no module running, "total": bytes}. The module
    events: m_times, m_ids, m_kinds (+1 begin, -1 end), n of them, in order. None without a whole
    backward() in the marks."""
    b0 = b1 = None
    for i in range(len(times)):
        if b0 is None:
            if kinds[i] == BACKWARD and times[i] >= since_us:
                b0 = times[i]
        elif kinds[i] == BACKWARD_END:
            b1 = times[i]
            break
    if b0 is None or b1 is None:
        return None
    made: dict = {}
    saved: list = []
    for e in trace:
        t = e["time_us"]
        if t < since_us:
            continue
        if t > b1:
            break
        action = e["action"]
        if action == "alloc":
            if t < b0:
                made[e["addr"]] = [t, e["size"]]
        elif action == "free_requested":
            block = made.pop(e["addr"], None)
            if block is not None and t >= b0:
                saved.append(block)
    saved.sort()  # by when each was made
    modules: dict = {}
    stack: list = []
    outside = total = 0
    j = 0
    for block in saved:
        t = block[0]
        while j < n and m_times[j] <= t:
            if m_kinds[j] > 0:
                stack.append(m_ids[j])
            elif stack:
                stack.pop()
            j += 1
        total += block[1]
        if stack:
            r = modules.get(stack[-1])
            if r is None:
                modules[stack[-1]] = r = [0, 0]
            r[0] += block[1]
            r[1] += 1
        else:
            outside += block[1]
    return {"modules": modules, "outside": outside, "total": total}


def fold(name: str) -> str:
    """`transformer.h.3.attn` -> `transformer.h[*].attn`: a repeated block's index folded."""
    out = ""
    for part in name.split("."):
        if part.isdigit() and out:
            out = f"{out}[*]"
        else:
            out = f"{out}.{part}" if out else part
    return out


def group(name: str) -> str:
    """A folded name cut after a repeated block's child (`transformer.h[*].attn.c_attn` ->
    `transformer.h[*].attn`), or after its second part where nothing repeats."""
    parts = name.split(".")
    for i in range(len(parts)):
        if parts[i].endswith("[*]"):
            return ".".join(parts[:i + 2])
    return ".".join(parts[:2])


def _name(root, wanted: dict, names: dict) -> None:
    """Names (folded) for the module ids in `wanted`, from one root's named_modules(); the root's own
    is its class's name."""
    own = type(root).__name__
    for name, m in root.named_modules():
        key = id(m)
        if key in wanted and key not in names:
            names[key] = fold(name) if name else own


def _compiled() -> bool:
    """Whether torch.compile (dynamo) has compiled a frame in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        counters = utils.counters
        stats = counters.get("stats")
        frames = counters.get("frames")
        return bool((stats and stats.get("unique_graphs")) or (frames and frames.get("ok")))
    except Exception:
        return True  # not known: not risked


def _count() -> int:
    return gc.get_count()[0]


def _put_back(bulk, c0: int) -> None:
    from ..neutral import _put_back as put_back
    put_back(bulk.ballast, _count(), c0)
