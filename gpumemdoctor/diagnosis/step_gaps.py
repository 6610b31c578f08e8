"""The longest gap between two step ends, as the program felt it, where it stands out. Pure.

The agent stamps each step's end and keeps the longest gap after the first five steps, with what
ran inside it: its own work, and the collections timed by its collector callback (_agent/readings/felt.py).
A gap is told when it is at least STANDS_OUT_S and STANDS_OUT_TIMES the median of the gaps before
it: a stall a user notices. The note says what the gap held, from those figures only; where the
agent's work and the collections leave most of it unexplained, it says so.
"""
from __future__ import annotations

from ..recording.recording import AgentRecording

STANDS_OUT_S = 0.05
STANDS_OUT_TIMES = 3.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def note(agent: AgentRecording) -> str | None:
    gaps = (agent.exit_info or {}).get("step_gaps")
    if not gaps:
        return None
    gap, typical = gaps["step_gap_max_s"], gaps["step_gap_typical_s"]
    if gap < STANDS_OUT_S or (typical is not None and gap < STANDS_OUT_TIMES * typical):
        return None
    held = []
    if gaps["step_gap_collection_s"] > 0:
        generation = gaps["step_gap_collection_generation"]
        which = ("a full garbage collection (generation 2)" if generation == 2
                 else f"garbage collection (generation {generation})")
        held.append(f"{which} {_ms(gaps['step_gap_collection_s'])}")
    held.append(f"gpumemdoctor's own work {_ms(gaps['step_gap_agent_s'])}")
    rest = gap - gaps["step_gap_collection_s"] - gaps["step_gap_agent_s"]
    if typical is not None and rest > STANDS_OUT_TIMES * typical and rest > STANDS_OUT_S:
        held.append(f"{_ms(rest)} that was neither (the program's own work, or a wait outside Python)")
    scale = f" (the median of the gaps before it: {_ms(typical)})" if typical is not None else ""
    return (f"process {agent.pid}: the longest gap between two step ends was {_ms(gap)}, at step "
            f"{gaps['step_gap_max_step']}{scale}; in it: {', '.join(held)}")
