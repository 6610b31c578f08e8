"""Pauses in a loop's steps (an evaluation, a validation epoch), read from the samples. Pure.

A program that marks steps (optimizer steps, `gpumemdoctor.step()`) is sampled at its step
boundaries; when no step comes for a sampling interval, the agent's thread samples over time.
So a stretch of time samples after the first step sample is a *pause* in the steps: an
evaluation between training epochs, Lightning's validation loop, the evaluation after the last
step. Each pause is measured against the step samples around it:

- `before`: the floor of allocated memory over the last PAUSE_EDGE step samples before it;
- `height`: the highest allocated memory that its samples read;
- `steps_peak`: the highest the steps reached before any pause (PyTorch's allocated peak counter
  at the last step sample before the first pause): a pause that stays below it made no peak;
- `after`: the floor over the first PAUSE_EDGE step samples after it, or, for a pause after
  the last step, the live tensors at exit (what the program still held at its end).

A stretch is a pause only when it lasts at least PAUSE_STEPS median steps (and PAUSE_MIN_S), from
the step sample before it to the first after it (or to its last sample): a slow step is sampled
over time too, and its activations are no pause. `rise` = height - before is what the pause held
at its height; `kept` = after - before is what it left behind. Thresholds and what they decide: judgement.py (`staircase`, `phase_bound`),
documented in docs/verdicts.md ("Accumulations over phases").
"""
from __future__ import annotations

from dataclasses import dataclass

from ..contract import PAUSE_MIN_S, PAUSE_STEPS
from ..units import MIB

PAUSE_EDGE = 3  # step samples on each side whose floor is the level before and after a pause
# A stretch without steps is a pause only when it lasts PAUSE_STEPS times the loop's median step
# (slow steps are sampled over time too: a step of 200 ms holds ten time samples) and PAUSE_MIN_S
# (contract.py: the agent's phase watch tells a pause by the same rule).


@dataclass
class Pause:
    """One pause in the steps, on one device."""

    t0: float  # its first sample
    t1: float  # its last sample
    step: int  # the step count during it (no step came)
    samples: int  # its own (time) samples
    before: int  # allocated floor at the steps before it
    height: int  # highest allocated reading in it
    after: int | None  # allocated floor at the steps after it, or live at exit; None: not known
    last: bool  # no step came after it
    since_s: float = 0.0  # the step sample before it
    until_s: float | None = None  # the step sample after it (None: none came)
    steps_peak: int | None = None  # PyTorch's allocated peak at the last step sample before any pause

    @property
    def span_s(self) -> float:
        return (self.until_s if self.until_s is not None else self.t1) - self.since_s

    @property
    def rise(self) -> int:
        return self.height - self.before

    @property
    def kept(self) -> int | None:
        return None if self.after is None else self.after - self.before

    def to_json(self) -> dict:
        return {"t0": round(self.t0, 3), "t1": round(self.t1, 3), "step": self.step, "samples": self.samples,
                "before_bytes": self.before, "height_bytes": self.height, "after_bytes": self.after,
                # sizes in a report are never negative: a pause that ended lower kept nothing
                "rise_bytes": max(0, self.rise), "kept_bytes": None if self.kept is None else max(0, self.kept),
                "freed_below_bytes": None if self.kept is None else max(0, -self.kept),
                "steps_peak_bytes": self.steps_peak,
                "last": self.last}


def pauses(readings: list[tuple], live_at_exit: int | None) -> list[Pause]:
    """The pauses in a series of (by, t, step, allocated, allocated peak) readings of one device,
    in order. Only programs that mark steps have pauses; the readings before the first step
    sample are start-up, not a pause."""
    out: list[Pause] = []
    steps: list[int] = []  # allocated at the step samples of the stretch being read
    pending: list[tuple[float, int | None, int]] = []  # (t, step, allocated) of the current pause
    open_before: int | None = None
    waiting: list[Pause] = []  # pauses whose level after is read from the next step samples
    for by, t, step, allocated, _ in readings:
        if allocated is None:
            continue
        if by == "step":
            if pending:
                waiting.append(_pause(pending, open_before, False))
                waiting[-1].until_s = t
                pending = []
                steps = []
            steps.append(allocated)
            if waiting and len(steps) >= PAUSE_EDGE:
                for p in waiting:
                    p.after = min(steps[:PAUSE_EDGE])
                out.extend(waiting)
                waiting = []
            open_before = (min(steps[-PAUSE_EDGE:]), t)
        elif by == "time" and open_before is not None:
            if waiting and not pending:  # another pause came before PAUSE_EDGE step samples
                for p in waiting:
                    p.after = min(steps)
                out.extend(waiting)
                waiting = []
            pending.append((t, step, allocated))
    if waiting:  # a pause followed by fewer step samples than PAUSE_EDGE: their floor all the same
        for p in waiting:
            p.after = min(steps) if steps else None
        out.extend(waiting)
    if pending:
        out.append(_pause(pending, open_before, True))
        out[-1].after = live_at_exit
    step_s = median_step_s(readings)
    least = max(PAUSE_MIN_S, PAUSE_STEPS * step_s) if step_s is not None else PAUSE_MIN_S
    out = [p for p in out if p.span_s >= least]
    if out:  # the highest the steps alone reached: PyTorch's peak counter before the first pause
        peaks = [peak for by, t, _, _, peak in readings if by == "step" and t <= out[0].since_s]
        for p in out:
            p.steps_peak = peaks[-1] if peaks else None
    return out


def median_step_s(readings: list[tuple]) -> float | None:
    """The loop's median seconds per step, from consecutive step samples (pauses and all)."""
    per_step = []
    last = None
    for by, t, step, *_ in readings:
        if by != "step" or step is None:
            continue
        if last is not None and step > last[1]:
            per_step.append((t - last[0]) / (step - last[1]))
        last = (t, step)
    per_step.sort()
    return per_step[len(per_step) // 2] if per_step else None


def _pause(pending: list, before: tuple, last: bool) -> Pause:
    return Pause(t0=pending[0][0], t1=pending[-1][0], step=pending[0][1] or 0, samples=len(pending),
                 before=before[0], height=max(a for _, _, a in pending), after=None, last=last,
                 since_s=before[1])
