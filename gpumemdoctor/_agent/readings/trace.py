"""PyTorch's allocation history (the stack of each live block): turned on and off, as --trace says.

"on": from CUDA's start. "auto" (the default): from CUDA's start for a start-up window
(STARTUP_WINDOW_S or STARTUP_STEPS, whichever ends first), so that a script that leaks in its
first moments gets its allocating line; then again once growth is suspected (watch.py): seen
between steps, until the growth search has been made; seen over time, for TRACE_WINDOW_S; and
for a pause in the steps that rises above all the steps reached (phase_watch.py), until the next step.
"off": never. Holders are looked for in every mode.
"""
from __future__ import annotations

import os
import time

from ..neutral import quiet_gc
from ...contract import ENV_SNAPSHOT, ENV_TRACE, TRACE_MODES

TRACE_MAX_ENTRIES = 100_000  # of PyTorch's allocation history (a ring: old entries drop off)
# --trace auto records stacks once growth is seen until the growth search has been made (growth
# seen between steps: the search is INVESTIGATE_AFTER_STEPS later), or for TRACE_WINDOW_S (seen
# over time, in a program without steps, whose holders are looked for at exit); then it stops. The
# leak's line is known by then (its blocks keep their stacks, and its later blocks join them by
# their holder), and a long run neither pays the history's cost on every allocation nor builds a
# snapshot of every leaked block at exit. That cost, measured on the H100 in one process (GPT-2 of
# corpus/, 400 steps in alternating blocks): 14.65 ms a step without stacks, 16.30 ms with them
# (+11%). The window was 60 s (up to 6.6 s of such a loop), then 10 s (1.1 s); now 16 steps.
TRACE_WINDOW_S = 10.0
# The start-up window: stacks from CUDA's start for this long or this many steps. Growth between
# steps is suspected at the second positive check, 16 samples in at the earliest, and then opens its
# own window; a short script spends all its life in this one.
STARTUP_WINDOW_S = 5.0
STARTUP_STEPS = 50


class Trace:
    """Whether allocation stacks are being recorded, were recorded, and until when."""

    def __init__(self, shared, sampler, run_dir: str | None):
        self.shared = shared
        self.sampler = sampler  # its lock: the agent's thread reads through it too
        self.history = None  # history.History, whose ring follows the stacks: core sets it
        mode = os.environ.get(ENV_TRACE, "auto" if run_dir else "off")
        self.mode = mode if mode in TRACE_MODES else "auto"
        self.on = False
        self.was_on = False  # stacks were recorded for a while (--trace auto stops after a window)
        self.stop_at: float | None = None  # monotonic time: --trace auto's window ends
        self.stop_step = 1 << 62  # ... or this step (the start-up window)
        self.window = ""  # which window is open: "start-up" or "growth"

    def start(self, why: str, until_step: int | None = None) -> None:
        """PyTorch's allocation history with Python stacks, from now on (--trace auto's growth
        window: until `until_step` when given, else for TRACE_WINDOW_S)."""
        shared = self.shared
        error = None
        started = time.perf_counter()
        elapsed = None
        try:
            # "state" keeps the stack of each live block and no event history: cheaper, and the
            # snapshot stays quick to take. The event history is kept only for --snapshot.
            enabled = "all" if os.environ.get(ENV_SNAPSHOT) == "1" else "state"
            # The call alone is timed (`elapsed_s`): on the program's thread it is a pause in its step.
            # PyTorch's Python side is a plain wrapper; its C++ side registers, at the first call, a
            # RecordFunction callback for annotations and takes each device allocator's lock.
            if self.on:
                pass  # already recording (the start-up window, still open): the window alone changes
            elif self.history.on:  # the events go on, without stacks; the live blocks get theirs
                self.history.ring.apply(True)
            else:
                shared.torch.cuda.memory._record_memory_history(
                    enabled=enabled, context="alloc", stacks="python", max_entries=TRACE_MAX_ENTRIES)
            elapsed = time.perf_counter() - started
            self.on = self.was_on = True
            if self.mode == "auto" and os.environ.get(ENV_SNAPSHOT) != "1" and why in ("growth", "start-up", "phase"):
                self.window = why
                if why in ("growth", "phase") and until_step is not None:
                    self.stop_at, self.stop_step = float("inf"), until_step
                elif why == "growth":
                    self.stop_at, self.stop_step = time.monotonic() + TRACE_WINDOW_S, 1 << 62
                else:
                    self.stop_at, self.stop_step = time.monotonic() + STARTUP_WINDOW_S, shared.steps + STARTUP_STEPS
        except Exception as exc:  # the cudaMallocAsync backend has no history
            error = f"{type(exc).__name__}: {exc}"[:300]
        if elapsed is None:
            elapsed = time.perf_counter() - started
        shared.channel.write({"type": "trace", "t": time.monotonic(), "step": shared.steps, "why": why,
                              "ok": self.on, "error": error, "elapsed_s": round(elapsed, 5)})

    def stop(self, on_program_thread: bool = False) -> None:
        """The end of --trace auto's window: no more stacks for new allocations; the live
        blocks allocated meanwhile keep theirs. On the program's thread (a step boundary) it
        leaves the collector's count as it found it (see neutral.py): the window closes in the
        middle of the program's loop, and a shifted count would move its later collections."""
        sampler = self.sampler
        if on_program_thread and sampler.neutral is not None:
            with sampler.lock, quiet_gc():  # the lock: the agent's thread reads through it too
                sampler.neutral.read(self._stop, None)
        else:
            self._stop(None)

    def _stop(self, _) -> None:
        shared = self.shared
        if self.window == "phase":
            why = "stopped at the step after the pause"
        elif self.window != "growth":
            why = f"start-up window ended ({STARTUP_WINDOW_S:g} s or {STARTUP_STEPS} steps)"
        elif self.stop_at == float("inf"):
            why = "stopped after the growth search"
        else:
            why = f"stopped after {TRACE_WINDOW_S:.0f} s"
        self.stop_at, self.stop_step = None, 1 << 62
        started = time.perf_counter()
        try:
            if self.history.on:  # the events go on (history.py), without stacks
                self.history.ring.apply(False)
            else:
                shared.torch.cuda.memory._record_memory_history(enabled=None)
            self.on = False
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        elapsed = time.perf_counter() - started
        shared.channel.write({"type": "trace", "t": time.monotonic(), "step": shared.steps,
                              "why": why, "ok": error is None, "error": error, "elapsed_s": round(elapsed, 5)})
