"""How each process ended, where its exit probes did not run: os._exit(), a signal, or unseen. Pure.

The agent's records reach its file as they are made (one write per record, no buffer), so a
process that leaves through os._exit() or is killed loses at most what came after its last
reading; os._exit() itself is seen (the agent's stand-in writes a last reading first). What the
exit probes would have measured (gc.collect(), the holder search, the breakdown at exit) is not
there: the report says so, and the judgement does not guess (judgement.py, rows 9 and 10).
"""
from __future__ import annotations

import signal

from .findings import Breakdown, Finding
from .judgement import unread as judged
from .summaries import tell
from ..recording.recording import AgentRecording, Recording


def how_ended(recording: Recording, agent: AgentRecording) -> dict | None:
    """None when the exit probes ran, or when the process outlived the run (an orphan: that
    finding tells about it). Else {"how", "status" or "signal", "t", "text"}."""
    if agent.exited_normally:
        return None
    process = next((p for p in recording.processes if p.pid == agent.pid), None)
    if process is not None and process.alive_after_exit:
        return None
    hard = agent.hard_exit
    if hard is not None:
        status = hard.get("status")
        return {"how": "os._exit", "status": status, "t": hard["t"],
                "text": tell("ended-hard-exit", status=status, t=hard["t"])}
    if agent.pid == recording.target_pid and recording.target.get("signal"):
        number = recording.target["signal"]
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = None
        return {"how": "signal", "signal": number, "t": None,
                "text": tell("ended-by-signal", number=number, signal_name=name)}
    return {"how": "unseen", "t": None, "text": tell("ended-unseen")}


def used_cuda(agent: AgentRecording) -> bool:
    return agent.cuda_t is not None or bool(agent.samples) or bool(agent.devices)


def note(agent: AgentRecording, ended: dict) -> str:
    """What the report says of a process whose end was not seen."""
    last = agent.samples[-1].t if agent.samples else None
    return tell("end-not-seen-note", pid=agent.pid, ended=ended, last_t=last)


def unread(pid: int, device: int, points: list, ended: dict, result) -> None:
    """A process that used CUDA through PyTorch but ended before its agent's first reading: what
    NVML saw of it, and the `unknown` finding (judgement row 10) instead of `non-torch`."""
    held = [used for _, used in points if used]
    if not held:
        return
    result.breakdowns.append(Breakdown(pid=pid, device=device, torch_index=None, nvml_bytes=held[-1],
                                       context_bytes=held[0], non_torch_bytes=max(0, held[-1] - held[0])))
    j = judged(pid, device, max(held), ended)
    result.findings.append(Finding(kind=j.kind, bytes=j.bytes, pid=pid, device=device, summary=j.summary,
                                   evidence=j.evidence, remedy=j.remedy))
