"""The longest gap between two steps, as the program felt it, where it stands out. Pure.

The agent stamps each step's end (the optimizer's hook) and, where it reads the model's first call
of each step, the step's start, and keeps the longest gap of each kind after the first five steps,
with what ran inside it: its own work by part, and the collections timed by its collector callback
(_agent/readings/felt.py). The note leads with the starts' gap where it was read: on an H200 it
agreed with a callback of the program within 0.1 ms, where the ends' read 5-10 ms high on loops that
synchronize after their optimizer's step (issue 57). A gap is told when it is at least STANDS_OUT_S
and STANDS_OUT_TIMES the median of the gaps before it: a stall a user notices. The note says what
the gap held, from those figures only; where the agent's work and the collections leave most of it
unexplained, it says so.
"""
from __future__ import annotations

from .summaries import tell
from ..recording.recording import AgentRecording

STANDS_OUT_S = 0.05
STANDS_OUT_TIMES = 3.0
PART_SHOWN_S = 0.0001  # the agent's parts named in the note: those of 0.1 ms or more, the largest first
PARTS_SHOWN = 3


def longest(gaps: dict) -> dict:
    """The gap the report leads with, in one shape: the starts' where the agent read them with what
    ran in them (recordings since 2026-12-03), else the ends'."""
    kind = "step_start_gap" if gaps.get("step_start_gap_agent_s") is not None else "step_gap"
    return {"between": "starts" if kind == "step_start_gap" else "ends", "gap_s": gaps[f"{kind}_max_s"],
            "step": gaps[f"{kind}_max_step"], "typical_s": gaps[f"{kind}_typical_s"],
            "agent_s": gaps[f"{kind}_agent_s"], "parts": gaps.get(f"{kind}_agent_parts") or {},
            "collection_s": gaps[f"{kind}_collection_s"], "generation": gaps[f"{kind}_collection_generation"]}


def note(agent: AgentRecording) -> str | None:
    gaps = (agent.exit_info or {}).get("step_gaps")
    if not gaps:
        return None
    g = longest(gaps)
    gap, typical = g["gap_s"], g["typical_s"]
    if gap < STANDS_OUT_S or (typical is not None and gap < STANDS_OUT_TIMES * typical):
        return None
    parts = sorted(((s, name) for name, s in g["parts"].items() if s >= PART_SHOWN_S), reverse=True)[:PARTS_SHOWN]
    rest = gap - g["collection_s"] - g["agent_s"]
    told_rest = typical is not None and rest > STANDS_OUT_TIMES * typical and rest > STANDS_OUT_S
    return tell("step-gap", pid=agent.pid, between=g["between"], gap_s=gap, step=g["step"], typical_s=typical,
                collection_s=g["collection_s"] if g["collection_s"] > 0 else None, generation=g["generation"],
                agent_s=g["agent_s"], parts=[(name, s) for s, name in parts], rest_s=rest if told_rest else None)
