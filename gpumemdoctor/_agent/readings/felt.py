"""The pause the program feels: the longest time between two of its steps, and what ran in it.

The agent's own figures count its own work. A program feels more: whatever stops its threads
between two step ends, the agent's work on any thread (which holds the GIL) and the collector's
runs, whoever made them due. `Felt` stamps each step's end (the optimizer's step hook, or
gpumemdoctor.step(), after the agent's own work there: where a callback of the program at the
step's end would stamp it) and keeps the longest gap after the first WARMUP_STEPS steps (their
kernels load and autotune), with what ran inside it:
- `agent_s`: the agent's work the program waited for in that gap (its work at the step's end,
  its samples on its own thread, its collector callback's readings, its calls on the main thread);
- `collection_s` and `generation`: the collections that ran in that gap (timed by the agent's
  collector callback from its start to its stop), and the oldest generation among them;
- `typical_s`: the median of the STEP_RING gaps before it, for scale.
Where step_inputs.py reads each step's first module call (the model's forward), `step_start` stamps
it too, and the longest gap between two steps' starts is kept beside: a program that synchronizes
after its optimizer's step (GPT-2's, ResNet's loops) stamps its own step end later than the
optimizer's hook, and its gaps are closer to the starts' (issue 57: 7-15 ms apart on an H200).
Plain floats and ints in slots and one list made once: stamping makes nothing the collector
tracks. The exit record carries `record()` in `exit_info.cost`.
"""
from __future__ import annotations

import time

WARMUP_STEPS = 5  # the gaps that end at these steps (and the next) are not counted (corpus/_common.py's)
STEP_RING = 16


class Felt:
    __slots__ = ("last_end", "busy", "gc_s", "gc_gen", "gc_started", "max_gap", "max_step", "max_agent",
                 "max_gc", "max_gen", "ring", "at_max", "max_filled", "gaps", "step", "last_start", "started",
                 "max_start_gap", "max_start_step", "start_gaps")

    def __init__(self):
        self.last_end = 0.0  # perf_counter at the last step's end
        self.busy = 0.0  # the agent's work since then
        self.gc_s = 0.0  # collections since then
        self.gc_gen = -1
        self.gc_started = 0.0
        self.max_gap = 0.0
        self.max_step = 0
        self.max_agent = 0.0
        self.max_gc = 0.0
        self.max_gen = -1
        self.ring = [0.0] * STEP_RING  # the last gaps, oldest overwritten
        self.at_max = [0.0] * STEP_RING  # the ring when the longest gap ended
        self.max_filled = 0  # how many of at_max were gaps then
        self.gaps = 0
        self.step = 0  # the last step that ended
        self.last_start = 0.0  # perf_counter at the last step's first module call
        self.started = -1  # the step whose start was stamped last
        self.max_start_gap = 0.0
        self.max_start_step = 0
        self.start_gaps = 0

    def add(self, spent: float) -> None:
        """The agent's work that the program waited for (any thread: it held the GIL)."""
        self.busy += spent

    def collection_start(self, now: float) -> None:
        self.gc_started = now

    def collection_stop(self, now: float, generation: int) -> None:
        if self.gc_started:
            self.gc_s += now - self.gc_started
            self.gc_started = 0.0
            if generation > self.gc_gen:
                self.gc_gen = generation

    def step_end(self, now: float, step: int) -> None:
        """A step ended at `now` (perf_counter), the agent's work at it done."""
        last, self.last_end = self.last_end, now
        self.step = step
        if step > WARMUP_STEPS + 1 and last:
            gap = now - last
            ring = self.ring
            if gap > self.max_gap:
                self.max_gap = gap
                self.max_step = step
                self.max_agent = self.busy
                self.max_gc = self.gc_s
                self.max_gen = self.gc_gen
                at_max = self.at_max
                for i in range(STEP_RING):  # (no slice: its object would move the collector's count)
                    at_max[i] = ring[i]
                self.max_filled = self.gaps if self.gaps < STEP_RING else STEP_RING
            ring[self.gaps % STEP_RING] = gap
            self.gaps += 1
        self.busy = 0.0
        self.gc_s = 0.0
        self.gc_gen = -1

    def step_start(self, now: float) -> None:
        """The step after the last one that ended began at `now` (its first module call)."""
        step = self.step + 1
        if step == self.started:
            return
        last, self.last_start = self.last_start, now
        if step > WARMUP_STEPS + 1 and last and self.started == step - 1:
            gap = now - last
            if gap > self.max_start_gap:
                self.max_start_gap = gap
                self.max_start_step = step
            self.start_gaps += 1
        self.started = step

    def record(self) -> dict:
        """The figures for the exit record (made at exit: the sort's list is the agent's own then)."""
        before = sorted(self.at_max[:self.max_filled])
        typical = before[len(before) // 2] if before else None
        return {"step_gap_max_s": round(self.max_gap, 6), "step_gap_max_step": self.max_step,
                "step_gap_agent_s": round(self.max_agent, 6), "step_gap_collection_s": round(self.max_gc, 6),
                "step_gap_collection_generation": self.max_gen if self.max_gc else None,
                "step_gap_typical_s": None if typical is None else round(typical, 6), "step_gaps": self.gaps,
                "step_start_gap_max_s": round(self.max_start_gap, 6) if self.start_gaps else None,
                "step_start_gap_max_step": self.max_start_step if self.start_gaps else None}


def count_since(agent, started: float) -> None:
    """The agent's work since `started` (perf_counter), on the main thread between two bytecodes,
    counted as what the program waited for."""
    felt = getattr(agent, "felt", None)
    if felt is not None:
        felt.busy += time.perf_counter() - started
