"""The pause the program feels: the longest time between two of its steps, and what ran in it.

The agent's own figures count its own work. A program feels more: whatever stops its threads
between two step ends, the agent's work on any thread (which holds the GIL) and the collector's
runs, whoever made them due. `Felt` stamps each step's end (the optimizer's step hook, or
gpumemdoctor.step(), after the agent's own work there: where a callback of the program at the
step's end would stamp it) and keeps the longest gap after the first GAP_WARMUP_STEPS steps (their
kernels load and autotune), with what ran inside it:
- `agent_s`: the agent's work the program waited for in that gap (its work at the step's end,
  its samples on its own thread, its collector callback's readings, its calls on the main thread),
  and `parts`, the same split by the part of the agent that did it (PARTS);
- `collection_s` and `generation`: the collections that ran in that gap (timed by the agent's
  collector callback from its start to its stop), and the oldest generation among them;
- `typical_s`: the median of the STEP_RING gaps before it, for scale.
Where step_inputs.py reads each step's first module call (the model's forward), `step_start` stamps
it too, and the longest gap between two steps' starts is kept beside, with what ran in it: a program
that synchronizes after its optimizer's step (GPT-2's, ResNet's loops) stamps its own step end later
than the optimizer's hook, and its gaps are the starts' (issue 57, on an H200: the starts' agree with
a callback's within 0.1 ms, the ends' read 5-10 ms high). The report leads with the starts' gap.
Plain floats and ints in slots and lists made once: stamping makes nothing the collector
tracks. The exit record carries `record()` in `exit_info.step_gaps`.
"""
from __future__ import annotations

import time

from ...contract import AGENT_PARTS

# The gaps that end at these steps (and the next) are not counted, as corpus/_common.py's
# STEP_GAP_MAX_MS (which benchmarks/step_gaps.py reads) skips its WARMUP_STEPS. Not
# contract.WARMUP_STEPS, the growth rules' warm-up (10 steps).
GAP_WARMUP_STEPS = 5
STEP_RING = 16
PARTS = AGENT_PARTS  # the parts of the agent whose work a gap holds (`add`'s first argument is the index)
STEP_END, SAMPLE, GROWTH_WATCH, PHASE_WATCH, PEAK_WATCH, HISTORY, HISTORY_READ, PEAK_PROBE, PHASE_SEARCH, \
    GROWTH_SEARCH, COLLECTOR = range(len(PARTS))


class _Window:
    """What ran since one stamp: the agent's work by part, and the collections."""
    __slots__ = ("parts", "gc_s", "gc_gen")

    def __init__(self):
        self.parts = [0.0] * len(PARTS)
        self.gc_s = 0.0
        self.gc_gen = -1

    def clear(self) -> None:
        parts = self.parts
        for i in range(len(parts)):
            parts[i] = 0.0
        self.gc_s = 0.0
        self.gc_gen = -1

    def collected(self, took: float, generation: int) -> None:
        self.gc_s += took
        if generation > self.gc_gen:
            self.gc_gen = generation

    def keep(self, into: "_Window") -> None:
        """Copy into `into` (no slice: its object would move the collector's count)."""
        parts, kept = self.parts, into.parts
        for i in range(len(parts)):
            kept[i] = parts[i]
        into.gc_s = self.gc_s
        into.gc_gen = self.gc_gen

    def figures(self, prefix: str) -> dict:
        parts = self.parts
        return {f"{prefix}_agent_s": round(sum(parts), 6),
                f"{prefix}_agent_parts": {PARTS[i]: round(parts[i], 6) for i in range(len(parts)) if parts[i] > 0},
                f"{prefix}_collection_s": round(self.gc_s, 6),
                f"{prefix}_collection_generation": self.gc_gen if self.gc_s else None}


class _Gaps:
    """The longest of one kind of gap (between ends, or between starts) after the warm-up: its step,
    what ran in it, and the ring of the gaps before it."""
    __slots__ = ("longest", "step", "held", "ring", "at_max", "filled", "count")

    def __init__(self):
        self.longest = 0.0
        self.step = 0
        self.held = _Window()  # what ran in the longest
        self.ring = [0.0] * STEP_RING  # the last gaps, oldest overwritten
        self.at_max = [0.0] * STEP_RING  # the ring when the longest gap ended
        self.filled = 0  # how many of at_max were gaps then
        self.count = 0

    def gap(self, gap: float, step: int, window: _Window) -> None:
        ring = self.ring
        if gap > self.longest:
            self.longest = gap
            self.step = step
            window.keep(self.held)
            at_max = self.at_max
            for i in range(STEP_RING):
                at_max[i] = ring[i]
            self.filled = self.count if self.count < STEP_RING else STEP_RING
        ring[self.count % STEP_RING] = gap
        self.count += 1

    def typical(self) -> float | None:
        """The median of the gaps before the longest (at exit: the sort's list is the agent's own then)."""
        before = sorted(self.at_max[:self.filled])
        return round(before[len(before) // 2], 6) if before else None


class Felt:
    __slots__ = ("last_end", "last_start", "step", "started", "gc_started", "since_end", "since_start",
                 "ends", "starts")

    def __init__(self):
        self.last_end = 0.0  # perf_counter at the last step's end
        self.last_start = 0.0  # perf_counter at the last step's first module call
        self.step = 0  # the last step that ended
        self.started = -1  # the step whose start was stamped last
        self.gc_started = 0.0
        self.since_end = _Window()  # what ran since the last step's end
        self.since_start = _Window()  # ... since the last step's start
        self.ends = _Gaps()  # between two steps' ends
        self.starts = _Gaps()  # between two steps' starts

    @property
    def gaps(self) -> int:
        return self.ends.count

    def add(self, part: int, spent: float) -> None:
        """The agent's work that the program waited for (any thread: it held the GIL), by part (PARTS)."""
        self.since_end.parts[part] += spent
        self.since_start.parts[part] += spent

    def collection_start(self, now: float) -> None:
        self.gc_started = now

    def collection_stop(self, now: float, generation: int) -> None:
        if self.gc_started:
            took = now - self.gc_started
            self.gc_started = 0.0
            self.since_end.collected(took, generation)  # (no tuple of the two: the collector tracks it)
            self.since_start.collected(took, generation)

    def step_end(self, now: float, step: int) -> None:
        """A step ended at `now` (perf_counter), the agent's work at it done."""
        last, self.last_end = self.last_end, now
        self.step = step
        if step > GAP_WARMUP_STEPS + 1 and last:
            self.ends.gap(now - last, step, self.since_end)
        self.since_end.clear()

    def step_start(self, now: float) -> None:
        """The step after the last one that ended began at `now` (its first module call)."""
        step = self.step + 1
        if step == self.started:
            return
        last, self.last_start = self.last_start, now
        if step > GAP_WARMUP_STEPS + 1 and last and self.started == step - 1:
            self.starts.gap(now - last, step, self.since_start)
        self.started = step
        self.since_start.clear()

    def record(self) -> dict:
        """The figures for the exit record (made at exit)."""
        ends, starts = self.ends, self.starts
        figures = {"step_gap_max_s": round(ends.longest, 6), "step_gap_max_step": ends.step,
                   **ends.held.figures("step_gap"), "step_gap_typical_s": ends.typical(), "step_gaps": ends.count,
                   "step_start_gap_max_s": round(starts.longest, 6) if starts.count else None,
                   "step_start_gap_max_step": starts.step if starts.count else None}
        if starts.count:
            figures.update(starts.held.figures("step_start_gap"))
            figures["step_start_gap_typical_s"] = starts.typical()
            figures["step_start_gaps"] = starts.count
        return figures


def count_since(felt: "Felt | None", part: int, started: float) -> None:
    """The agent's work since `started` (perf_counter), on the main thread between two bytecodes,
    counted as what the program waited for."""
    if felt is not None:
        felt.add(part, time.perf_counter() - started)
