"""The suspects a finding names, and their remedy: the step that attaches them to the judgement's
findings. Pure.

The judgement (judgement.py) asks for them while it makes a finding, so that each of its rows
returns the finding finished: a growing leak's suspects come from the searches made during the run
(suspects.leak_suspects), or, where no copy searched, from the peak's probes (probed.py), and then
the summary says why no search named its holder; what is alive at exit from the exit search; the
garbage's from what gc.collect() freed at exit. Each is read when a row asks for it, not before.
"""
from __future__ import annotations

from . import probed, suspects
from .remedies import FINDINGS
from ..recording.recording import AgentRecording


class Holders:
    """What the searches and probes of one process on one GPU say held its memory."""

    def __init__(self, agent: AgentRecording, torch_index: int):
        self.agent, self.torch_index = agent, torch_index

    def leak(self, released: bool) -> tuple[list[dict], dict, str | None, str]:
        """A growing leak's (suspects, root cause, why no search named its holder where the probe
        named it instead (else None), remedy)."""
        agent, i = self.agent, self.torch_index
        found, root_cause = suspects.leak_suspects(agent.root, i, released)
        named = probed.growth_suspects(root_cause, agent, i, released)
        unsearched = None
        if named:
            found, root_cause = named
            unsearched = root_cause["why_not"]
        remedy = found[0]["remedy"] if found and found[0]["holders"] else FINDINGS["leak-unsearched"]
        return found, root_cause, unsearched, remedy

    def live(self) -> tuple[list[dict], dict, str]:
        """What is alive at exit: (suspects, root cause, remedy)."""
        found, root_cause = suspects.live_suspects(self.agent.root, self.torch_index)
        return found, root_cause, found[0]["remedy"] if found else FINDINGS["live-at-exit-unsearched"]

    def garbage(self) -> tuple[list[dict], dict]:
        """What gc.collect() freed at exit: (suspects, what the look-up saw)."""
        return suspects.garbage_suspects(self.agent.root)

    def after_gc(self) -> dict:
        """The `gc` exit probe's figures, for a garbage-cycle finding's evidence."""
        after = self.agent.probes.get("gc")
        reading = after.reading(self.torch_index) if after is not None else None
        return {"allocated_after_gc_collect": reading.allocated_bytes if reading else None,
                "objects_collected": after.collected if after is not None else None}
