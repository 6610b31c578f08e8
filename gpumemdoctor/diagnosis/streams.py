"""Freed memory held for stream work at exit: unfinished work, or finished work the allocator had
not yet processed. Pure.

PyTorch's allocator keeps a block freed while another stream used it (`record_stream`, FSDP's and
DDP's communication streams) as *active* until the CUDA events it recorded there complete, and it
looks at those events only when it next allocates. So `active - allocated` at the program's end
mixes two things: work that had not finished (the memory is truly held for it), and work that had
finished long before (the memory is the allocator's cache a moment late; every clean FSDP rank
ends with some). The agent tells them apart at exit (_agent/readings/streams.py, the `pending` record):
one small allocation lets the allocator process every completed event, and what is still held
after it is held for work unfinished then, which the agent then waits for, stream by stream.

Recordings from before issue 42 have no `pending` record: for them the gap at the end is all
counted as pending, as it was then.
"""
from __future__ import annotations

from .summaries import stream_words, tell  # noqa: F401 (stream_words: its words are summaries.py's)
from ..recording.recording import AgentRecording

NOTE_MIN_BYTES = 64 << 20  # finished work's blocks worth a note in the report
MIN_WAIT_S = 0.1  # unfinished work that ended sooner than this after the program is its last step's own


def record(agent: AgentRecording, torch_index: int) -> dict | None:
    """The agent's `pending` record for this device, or None (none was needed, or an older recording)."""
    return next((r for r in agent.root.get("pending_streams") or [] if r["device"] == torch_index), None)


def held_bytes(found: dict | None, gap: int) -> int:
    """What was held for unfinished work at exit: the record's figure, else (older recordings, or
    no record written) the whole gap."""
    return min(gap, found["unfinished_bytes"]) if found is not None else gap


def finished_bytes(found: dict | None) -> int:
    """Blocks that waited only for the allocator to see that their work had finished."""
    if found is None:
        return 0
    return max(0, found["before_bytes"] - found["unfinished_bytes"])


def note(where: str, found: dict | None) -> str | None:
    """Where finished work's blocks were still counted active at exit, a note that says so."""
    settled = finished_bytes(found)
    if settled < NOTE_MIN_BYTES:
        return None
    return tell("finished-stream-work", where=where, settled_bytes=settled)


def evidence(found: dict | None) -> dict:
    """The judgement's figures: whether finished and unfinished work were told apart, how long the
    device's work ran on after the end, and the streams."""
    if found is None:
        return {"pending_told_apart": False, "pending_wait_s": None, "pending_streams": []}
    return {"pending_told_apart": True, "pending_wait_s": found["wait_s"],
            "pending_streams": [list(s) for s in found["streams"]],
            "pending_finished_bytes": finished_bytes(found)}
