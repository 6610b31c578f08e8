"""What the process held at its highest moments: the readings a peak's composition is made of.

After each sample (the sampler's lock held), each device's total (NVML's figure for the process,
else PyTorch's reserved memory) is compared with the highest one read so far. A new high, RISE
above it, is a capture, read on the thread that sampled, at once:
- the allocator's figures then: allocated, reserved, its allocated peak counter, and its free
  memory inside split segments (`inactive_split_bytes`: fragmentation);
- the parameters, gradients and optimizer state of every optimizer that has stepped (PyTorch's
  global step hook hands each one over once; only a weak reference is kept), each storage counted
  once and in the first of those categories it belongs to;
- what the program's main thread was running: its innermost frame in the program's own files,
  and whether it was inside backward() or an optimizer's step.
A capture made on the agent's thread (the steps paused, or a program without steps) also asks
the main thread, between two of its bytecodes (`Py_AddPendingCall`), for a probe of at most
PROBE_BUDGET_S: the tensors that the main module's globals and the locals of its running functions
hold, one level down (containers, public attributes), the modules among them, and how long a chain
of one operation the autograd graphs they carry repeat (a running sum's additions): probe.py. A
capture made at a step boundary runs the probe there, on the program's thread. A new high is
often seen while the call that made it runs (`wide = data.float()`); the main thread then runs the
probe as that call returns, before its result has a name: a second probe follows at the next
sample (at most MAX_DEFERRED samples later). What autograd graphs save is read by the holder
search, in a copy of the process (diagnosis/peak.py takes it from a search made in the same
pause); where no copy is made (the pause limit), the probes name the holders (diagnosis/probed.py).

The capture runs through `Neutral` (the program's collections come when they would have come)
and writes one line; the probe makes few containers and holds automatic collection off. Captures stop at MAX_CAPTURES, probes at MAX_PROBES; after LATE_CAPTURES
a new high must be LATE_RISE above the last. What each cost is in the exit record (`cost`).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from json.encoder import encode_basestring

from .. import main_thread
# Imported with the agent, not at the first probe: an import there (compiled from source where
# PYTHONDONTWRITEBYTECODE is set) would be part of the program's pause, as the search's once was.
from ..search.blocks import is_library_file
from ..readings.felt import PEAK_PROBE, count_since
from ..probe import Probe
from ..neutral import NO_ROOM, quiet_gc

_TORCH_DIR = os.sep + "torch" + os.sep

MIN_BYTES = 64 << 20  # no capture below this total
RISE_BYTES = 16 << 20
RISE_SHARE = 0.02  # a new high: above the last capture by RISE_BYTES and by this share
LATE_CAPTURES = 8
LATE_RISE = 0.10
MAX_CAPTURES = 32
# Two a capture: one as it is asked, one when a call's result is bound (_on_main_thread); a leak's
# last highs are the ones that tell (16 a process left hf_gpt2_kept_outputs' last 3 unread).
MAX_PROBES = 2 * MAX_CAPTURES
MAX_DEFERRED = 3  # samples a probe waits at most for a call's result to be named (_on_main_thread)
RETRY_S = 0.5  # a probe put off longer than this after its capture is dropped: what it saw has moved on
PROBE_BUDGET_S = 0.008  # of the program's time, on its main thread, per probe
MAX_OPTIMIZERS = 16


PARAMETERS, GRADIENTS, STATE = 1, 2, 4  # optimizer_figures' `which`: the storages it reads
ALL_STORAGES = PARAMETERS | GRADIENTS | STATE


class PeakWatch:
    """The captures at new highs, and the probes they ask of the main thread."""

    def __init__(self, shared, sampler, phase_watch, growth_watch):
        self.shared = shared
        self.sampler = sampler
        self.phase_watch = phase_watch  # a pause in the steps: the capture then asks for a probe
        self.growth_watch = growth_watch  # its copies searching: no probe meanwhile
        self.optimizers: list = []  # weak references, made on the program's thread through Neutral
        self.figures = [0, 0, 0]  # the last optimizer_figures: parameters, gradients, state (made once)
        self.last_optimizer = 0  # id() of the optimizer seen at the last step: one compare a step
        self.best: list = []  # per device slot: the highest total captured
        self.captures = 0
        self.probes = 0
        self.asked = False
        self.pending_capture = 0
        self.asked_t = 0.0
        self.pending_device = 0
        self.deferred = 0  # times the pending probe waited for a call's result to be named
        self.retry = 0  # the capture whose probe waits for the next sample
        self.exiting = False  # the exit's capture is being made (at_exit)
        self.callback = None
        self.add_pending = None
        self.main_ident = threading.main_thread().ident

    def prepare(self, devices: int) -> None:
        """Made once at CUDA's start, on the program's thread."""
        self.best = [0] * devices
        self.callback, self.add_pending = main_thread.pending_call(self._on_main_thread)

    # -- the optimizers ---------------------------------------------------------------
    def seen(self, optimizer) -> None:
        """From the step hook, on the program's thread: one compare unless the optimizer is new."""
        if id(optimizer) == self.last_optimizer:
            return
        self.last_optimizer = id(optimizer)
        for ref in self.optimizers:
            if ref() is optimizer:
                return
        if len(self.optimizers) >= MAX_OPTIMIZERS:
            return
        sampler = self.sampler
        if sampler.neutral is None:
            return
        with sampler.lock, quiet_gc():  # a weak reference is an object the collector counts
            sampler.neutral.read(self._keep, optimizer)

    def _keep(self, optimizer) -> None:
        self.optimizers.append(weakref.ref(optimizer))

    # -- the captures -----------------------------------------------------------------
    def check(self, now: float, by: str) -> float:
        """After each sample (the sampler's lock held): the thread time a capture and its probe took (left
        out of the sampler's pace: a rare capture is not a sample's cost)."""
        if self.retry and not self.asked and by != "exit":  # a probe put off (_on_main_thread)
            capture, self.retry = self.retry, 0
            if time.monotonic() - self.asked_t <= RETRY_S:  # (asked_t's clock); later, dropped: gone by
                if by == "step" and threading.get_ident() == self.main_ident:
                    self.probe(capture)  # a step boundary: the program's own thread, names bound
                else:
                    self.ask(capture, again=True)
        if self.captures >= MAX_CAPTURES:
            return 0.0
        sampler = self.sampler
        rows = sampler.rows
        live = sampler.live
        for i in range(len(rows)):
            if not live[i]:
                continue
            row = rows[i]
            total = row[5] or row[3] or 0
            best = self.best[i]
            if not new_high(total, best, self.captures):
                continue
            self.best[i] = total
            started = time.perf_counter()
            thread_started = time.thread_time()
            if (line := sampler.neutral.read(self._capture, i, by != "step")) is NO_ROOM:
                self.best[i] = best
                return 0.0
            self.shared.channel.write_line(line)
            cost = self.shared.cost
            spent = time.perf_counter() - started
            cost["peak_capture_s"] = cost.get("peak_capture_s", 0.0) + spent
            if spent > cost.get("peak_capture_max_s", 0.0):
                cost["peak_capture_max_s"] = spent
            if not self.asked:
                self.pending_device = row[0]  # the probe counts this device's tensors only
            if (by == "step" or by == "exit") and threading.get_ident() == self.main_ident:
                self.probe(self.captures, row[0])
            elif self.probes < MAX_PROBES and not self.asked and by != "exit":  # (check runs only with a run folder)
                self.deferred = 0
                self.retry = 0
                self.ask(self.captures)  # (after the pause's search, if one was asked for: see _on_main_thread)
            return time.thread_time() - thread_started  # one device a sample
        return 0.0

    def at_exit(self) -> None:
        """The exit's first reading (in the sampler's rows): a capture if it is a new high, probed here on
        the main thread (its globals: its frames are gone). A leak's high is often its end, after the last sample."""
        sampler = self.sampler
        if not self.shared.run_dir or not self.best:
            return
        locked = sampler.lock.acquire(timeout=0.05)
        self.exiting = True
        try:
            self.check(time.monotonic(), "exit")
        finally:
            self.exiting = False
            if locked:
                sampler.lock.release()

    def _capture(self, i: int) -> str:
        """One capture's line, written after its reading: a write lets the program run (its objects would count)."""
        shared = self.shared
        sampler = self.sampler
        row = sampler.rows[i]
        index = row[0]
        try:
            split = sampler.stats_fn(index)["inactive_split_bytes"]["all"]["current"]
        except Exception:
            split = None
        figures = self.figures
        names = self.optimizer_figures(index, figures)
        params, grads, state = figures
        where, inside = (None, "exit") if self.exiting else self.main_thread_place()
        self.captures += 1
        return (
            f'{{"type":"peak","n":{self.captures},"t":{time.monotonic()!r},"step":{shared.steps},'
            f'"device":{index},"allocated":{_int(row[1])},"reserved":{_int(row[3])},"nvml":{_int(row[5])},'
            f'"allocated_peak":{_int(row[6])},"inactive_split":{_int(split)},"parameters":{params},'
            f'"gradients":{grads},"optimizer_state":{state},"optimizers":[{names}],'
            f'"where":{_text(where)},"inside":{_text(inside)},"paused":{_bool(not self.exiting and self.paused())}}}')

    def optimizer_figures(self, index: int, figures: list, seen: dict | None = None, sizes: dict | None = None,
                          which: int = ALL_STORAGES, count: int | None = None) -> str:
        """optimizer_figures() of the optimizers that have stepped (the first `count` of them), on one
        device: for the captures, history.py's readings and oom.py's."""
        return optimizer_figures(self.optimizers, index, figures, seen, sizes, which, count)

    def paused(self) -> bool:
        """Whether the program's steps have paused (an evaluation between them)."""
        return bool(self.shared.steps) and self.phase_watch.pausing(time.monotonic())

    def main_thread_place(self):
        """The main thread's innermost frame in the program's own files ("file:line in f()"), and
        "backward" or "optimizer step" when it was inside one. The frame is never bound to a local
        here: this function's own frame is one of those walked, and would then hold itself."""
        try:
            return place(sys._current_frames().get(self.main_ident))
        except Exception:
            return None, None

    # -- the probes -------------------------------------------------------------------
    def ask(self, capture: int, again: bool = False) -> None:
        self.pending_capture = capture
        if not again:  # (a probe asked again keeps its capture's time)
            self.asked_t = time.monotonic()
        self.asked = True  # before the call is queued: the main thread may run it at once
        if not main_thread.ask(self.add_pending, self.callback):
            self.asked = False

    def _on_main_thread(self, _) -> int:
        """Between two of the main thread's bytecodes (main_thread.py). Never raises. Not when the
        pause's search, asked for at the same sample and run just before, made a copy: the program
        has paused for that already, and the copy reads more than the probe would. When the
        program's own code is about to name what a call just returned (`wide = data.float()`, a new
        high seen while the call ran), the probe is made now (what the names hold before the moment
        moves on: a validation's outputs, just before the list is cleared) and once more at the next
        sample (at most MAX_DEFERRED samples later), when the result has its name; the diagnosis
        takes the one that found the most. Not in a library's frame: the probe reads no library's
        locals, and one that waits there for each `x = f()` comes after an evaluation has ended (two
        corpus programs on the H100 lost the holders at their evaluations' height so)."""
        started = time.perf_counter()
        try:
            frame = sys._getframe(1)
            self.asked = False
            copied = any(c.t >= self.asked_t for c in self.growth_watch.copies)
            now = not copied and not main_thread.interrupted(frame) and not self.shared.finished
            if (self.deferred < MAX_DEFERRED and not is_library_file(frame.f_code.co_filename)
                    and main_thread.binding(frame)):
                if now and self.deferred == 0:  # what the names hold now, before the moment moves on
                    self.probe(self.pending_capture)
                self.deferred += 1
                self.retry = self.pending_capture
                return 0
            if now:
                self.probe(self.pending_capture)
        except Exception:
            pass
        count_since(self.shared.felt, PEAK_PROBE, started)
        return 0

    def probe(self, capture: int, device: int | None = None) -> None:
        """The tensors the program's names hold, on its own thread, within PROBE_BUDGET_S, with automatic
        collection held off. It makes few containers (Probe.run), and at most MAX_PROBES run in a process:
        unlike a reading, it does not go through `Neutral`, whose ballast is for a reading's dicts."""
        if self.probes >= MAX_PROBES or self.shared.torch is None:
            return
        self.probes += 1
        with quiet_gc():
            self._probe(capture, self.pending_device if device is None else device)

    def _probe(self, capture: int, device: int) -> None:
        started = time.perf_counter()
        try:
            probe = Probe(self.shared.torch, started + PROBE_BUDGET_S,
                          on_device=lambda t: t.is_cuda and t.get_device() == device)
            probe.optimizers([ref() for ref in self.optimizers])
            record = probe.run()
            del probe
        except Exception as exc:
            record = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        spent = time.perf_counter() - started
        record.update({"type": "peak_probe", "n": capture, "t": time.monotonic(), "elapsed_s": round(spent, 5)})
        self.shared.channel.write(record)
        cost = self.shared.cost
        cost["peak_probe_s"] = cost.get("peak_probe_s", 0.0) + spent
        if spent > cost.get("peak_probe_max_s", 0.0):
            cost["peak_probe_max_s"] = spent


def new_high(value: int, best: int, done: int) -> bool:
    """Whether `value` is a high worth reading over `best`, the highest read so far, after `done`
    readings: the rule of the captures here and of history.py's readings."""
    share = LATE_RISE if done >= LATE_CAPTURES else RISE_SHARE
    return value >= MIN_BYTES and value >= best + RISE_BYTES and value >= best * (1 + share)


def place(frame) -> tuple[str | None, str | None]:
    """From `frame` outwards: the innermost frame in the program's own files ("file:line in f()"),
    and "backward" or "optimizer step" when it is inside one."""
    where = inside = None
    while frame is not None:
        code = frame.f_code
        name = code.co_filename
        if inside is None and _TORCH_DIR in name:
            if code.co_name in ("backward", "_engine_run_backward"):
                inside = "backward"
            elif _TORCH_DIR + "optim" + os.sep in name:
                inside = "optimizer step"
        if where is None and not is_library_file(name):
            where = f"{os.path.basename(name)}:{frame.f_lineno} in {code.co_name}()"
        frame = frame.f_back
    return where, inside


def optimizer_figures(optimizers: list, index: int, figures: list, seen: dict | None = None,
                      sizes: dict | None = None, which: int = ALL_STORAGES, count: int | None = None) -> str:
    """The JSON rows `["class",p,g,s],...` of every optimizer in `optimizers` (weak references: the
    ones that have stepped) on one device, and their parameters, gradients and optimizer state added
    up into `figures` (three items): each storage counted once, in the first of those categories it
    belongs to (`seen`, when given, is left with {storage address: 1, 2 or 3}, and `sizes` with their
    bytes: history.py's readings). It makes no container but its `seen` dict and strings (not even a
    tuple to return): a capture runs inside the program's step and must leave the collector's count
    as it was. `which` (PARAMETERS, GRADIENTS, STATE, or'd) and `count` (the first so many
    optimizers) read a part of them: a reading put off reads the gradients at its moment, and the
    rest, which stay while an optimizer steps, at its walk (reading.py)."""
    if seen is None:
        seen = {}  # storage address -> category: each storage counted once
    params = grads = state = 0
    names = ""
    n = len(optimizers) if count is None or count > len(optimizers) else count
    for k in range(n):
        opt = optimizers[k]()
        if opt is None:
            continue
        p_bytes = g_bytes = s_bytes = 0
        try:
            for group in opt.param_groups:
                for p in group["params"]:
                    if which & PARAMETERS:
                        p_bytes += _count(p, index, seen, 1, sizes)
                    if which & GRADIENTS:
                        g = p.grad
                        if g is not None:
                            g_bytes += _count(g, index, seen, 2, sizes)
                    if which & STATE:
                        st = opt.state.get(p)
                        if st:
                            for v in st.values():
                                s_bytes += _count(v, index, seen, 3, sizes)
        except Exception:
            pass
        params += p_bytes
        grads += g_bytes
        state += s_bytes
        name = _text(type(opt).__name__)
        names = (f'{names},[{name},{p_bytes},{g_bytes},{s_bytes}]' if names
                 else f'[{name},{p_bytes},{g_bytes},{s_bytes}]')
        del opt
    figures[0], figures[1], figures[2] = params, grads, state
    return names


def _count(t, index: int, seen: dict, category: int, sizes: dict | None = None) -> int:
    """The bytes of t's storage if it lies on this device and is not counted yet (into `sizes` too)."""
    try:
        if t.get_device() != index:
            return 0
        storage = t.untyped_storage()
        address = storage.data_ptr()
        if address in seen:
            return 0
        seen[address] = category
        if sizes is None:
            return storage.nbytes()
        size = sizes[address] = storage.nbytes()
        return size
    except Exception:
        return 0


def _int(value) -> str:
    return "null" if value is None else str(int(value))


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _text(value) -> str:
    """A JSON string (json's own C escaping: quotes, backslashes and control characters), or null."""
    return "null" if value is None else encode_basestring(value)
