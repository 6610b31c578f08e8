"""A holder search at a pause's height: what an evaluation gathers before it lets go of it.

An evaluation without torch.no_grad() that sums its losses without .item() holds every batch's
autograd graph until it returns: gigabytes for a fraction of a second, gone before any search at a
step or at exit could see them. So while the steps pause (no step for a sampling interval, and for
PAUSE_STEPS median steps: a slow step is no pause), each time sample on the agent's thread compares
allocated memory with the steps': once it is PHASE_RISE_BYTES above their level at the last step
sample and above everything the steps had reached before the first pause (PyTorch's peak counter
then: each evaluation of a run may be searched, not only the first), a search is
asked for on the program's main thread (`Py_AddPendingCall`: it runs there at the next bytecode
boundary, where a step boundary's search would run; no signal, no hook, nothing the program can
see) and made there as a growth search is: in a copy of the process (growth_watch.search("phase")),
over all live memory. The program pauses for the fork once, in its evaluation, not in its training
steps; at most MAX_PHASE_SEARCHES per process, one per pause, never while a copy searches. With
--trace auto and no stacks being recorded, the first such sample of a pause asks for the stacks
instead (trace.start("phase"), until the next step), and a later one, TRACED_BYTES higher, for
the search: the pause's allocating line is then known. While a pause rises so (`rising_step`), the
agent's thread samples at least every RISING_INTERVAL_S (sampler.py), for RISING_FOR_S at most, so
that a short evaluation gets its stacks, its height and its search before it ends, whatever the
samples' pace.

Everything here on the sampling path is ints and floats kept in lists made once (`prepare`): it
makes no container the program's collector would count, until a search is asked for.
"""
from __future__ import annotations

import sys
import time

from .. import main_thread
from ..readings.felt import PHASE_SEARCH
from ...contract import PAUSE_MIN_S, PAUSE_STEPS, PEAK_MIN_BYTES as PHASE_RISE_BYTES  # the diagnosis's too

MAX_PHASE_SEARCHES = 2
MIN_STEP_SAMPLES = 8  # step samples before a pause can be told from a slow step
TRACED_BYTES = 64 << 20  # allocated with stacks on, in the pause, before its search (--trace auto)
STEP_WEIGHT = 0.1  # of the newest step in the running mean of the seconds per step
# The longest interval between time samples while a pause rises above the steps. A Lightning
# validation of 0.22 s on the H100 got one sample when a paced interval had grown to 0.21 s.
RISING_INTERVAL_S = 0.05
RISING_FOR_S = 5.0  # at most this long a pause: one that never ends (inference after training) is paced again


class PhaseWatch:
    """The pause check on the time samples, and the search it asks the main thread for."""

    def __init__(self, shared, sampler, trace, growth_watch):
        self.shared = shared
        self.sampler = sampler
        self.trace = trace
        self.growth_watch = growth_watch  # its copies: one search at a time; it makes the copy
        self.level: list = []  # per device slot: allocated at the last step sample
        self.steps_peak: list = []  # per device slot: PyTorch's allocated peak then, until the first pause
        self.paused = False  # a pause was seen: the steps' peak is kept as it was before it
        self.step_s = 0.0  # running mean of seconds per step, between step samples
        self.step_samples = 0
        self.last_step_n = 0  # the step count at the last step sample, and its time (no tuple: the
        self.last_step_t = 0.0  # step path makes no container)
        self.searched_step = -1  # the pause (its step count) already searched
        self.traced_step = -1  # the pause whose stacks were asked for, and the reading then
        self.traced_bytes = 0
        self.action = "search"  # what the main thread is asked for: "trace" or "search"
        self.searches = 0
        self.rising_step = -1  # the pause (its step count) that rose above the steps, until when
        self.rising_until = 0.0
        self.asked = False  # a search was asked for and has not run yet
        self.callback = None  # the C callback for Py_AddPendingCall, made once
        self.add_pending = None

    def prepare(self, devices: int) -> None:
        """Made once at CUDA's start, on the program's thread."""
        self.level = [0] * devices
        self.steps_peak = [0] * devices
        self.callback, self.add_pending = main_thread.pending_call(self._on_main_thread)

    def check(self, now: float, by: str) -> None:
        """After each sample (the sampler's lock held)."""
        shared = self.shared
        rows = self.sampler.rows
        live = self.sampler.live
        if by == "step":
            steps, t = self.last_step_n, self.last_step_t
            if shared.steps > steps and t:
                per_step = (now - t) / (shared.steps - steps)
                self.step_s = per_step if self.step_s == 0.0 else self.step_s + (per_step - self.step_s) * STEP_WEIGHT
            self.last_step_n = shared.steps
            self.last_step_t = now
            self.step_samples += 1
            for i in range(len(rows)):
                if live[i]:
                    self.level[i] = rows[i][1] or 0
                    if not self.paused:  # (PyTorch's counter keeps the pauses' own heights after them)
                        self.steps_peak[i] = rows[i][6] or 0
            return
        if by != "time" or self.step_samples < MIN_STEP_SAMPLES:
            return
        if not self.pausing(now):
            return  # a slow step, sampled over time: not a pause
        self.paused = True
        if (self.asked or self.add_pending is None or self.searches >= MAX_PHASE_SEARCHES
                or self.searched_step == shared.steps or self.growth_watch.copies):
            return
        trace = self.trace
        for i in range(len(rows)):
            allocated = rows[i][1]
            if (live[i] and allocated is not None and allocated - self.level[i] >= PHASE_RISE_BYTES
                    and allocated > self.steps_peak[i]):
                if self.rising_step != shared.steps:
                    self.rising_step = shared.steps
                    self.rising_until = now + RISING_FOR_S
                if trace.mode == "auto" and not trace.on and self.traced_step != shared.steps:
                    self.traced_step = shared.steps
                    self.traced_bytes = allocated
                    self.ask("trace")
                elif self.traced_step != shared.steps or allocated >= self.traced_bytes + TRACED_BYTES:
                    self.ask("search")
                return

    def pausing(self, now: float) -> bool:
        """No step for PAUSE_STEPS median steps (and PAUSE_MIN_S): the steps pause, a slow step does not."""
        least = PAUSE_STEPS * self.step_s
        return now - self.shared.last_step_t >= (least if least > PAUSE_MIN_S else PAUSE_MIN_S)

    def ask(self, action: str = "search") -> None:
        """Ask the main thread for the search (or the stacks), at its next bytecode boundary."""
        self.asked = True
        self.action = action
        if action == "search":
            self.searched_step = self.shared.steps
        if not main_thread.ask(self.add_pending, self.callback):
            self.asked = False  # the queue of pending calls was full: a later sample asks again

    def _on_main_thread(self, _) -> int:
        """Runs on the program's main thread, between two of its bytecodes. Never raises."""
        started = time.perf_counter()
        try:
            self.asked = False
            if main_thread.interrupted(sys._getframe(1)):
                if self.action == "search":
                    self.searched_step = -1  # a later sample of this pause asks again
                else:
                    self.traced_step = -1
                return 0
            shared = self.shared
            if self.action == "trace":
                if not self.trace.on and not shared.finished:
                    self.trace.start("phase", until_step=shared.steps + 1)
                return 0
            watch = self.growth_watch
            if watch.copies:
                watch.poll_copies()
            if not watch.copies and not self.shared.finished:
                self.searches += 1
                watch.search("phase", started=started)  # (the pause limit counts this walk too)
                cost = self.shared.cost  # what the program waited for: this walk, the threads' capture, the fork
                spent = time.perf_counter() - started
                cost["phase_pause_s"] = max(cost.get("phase_pause_s", 0.0), spent)
                shared.felt.add(PHASE_SEARCH, spent)  # (felt.py: what the program waited for)
        except Exception:
            pass
        return 0
