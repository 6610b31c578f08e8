"""The peaks that could be lower: the warnings a peak's composition (peak.py) makes, each with the claim
it rests on where it says more than its figures: free memory split inside the allocator's segments
(CUDA graphs' pools left out), a running function's one large local, gradients and optimizer state held
through an evaluation, autograd graphs kept by the program's names in a pause. Pure."""
from __future__ import annotations

from . import claims, words
from .findings import Finding, PeakComposition
from .remedies import FINDINGS
from .summaries import tell
from ..contract import PEAK_MIN_BYTES as MIN_FINDING_BYTES

FRAGMENTED_SHARE = 0.10  # of the peak: free memory in split segments
TEMPORARY_SHARE = 0.25  # of the allocated memory: one running function's local
STATE_SHARE = 0.25  # of the peak: gradients and optimizer state held through an evaluation
GRAPHS_SHARE = 0.20  # of the allocated memory: graphs kept by the program's names in a pause


def findings(c: PeakComposition, capture: dict, where: str) -> list[Finding]:
    """The peaks that could be lower; each a warning, never a verdict."""
    out: list[Finding] = []
    moment = {"where": where, "total_bytes": c.total_bytes, "step": c.step, "highest": c.highest}
    evidence = {"decided_by": "peak", "peak_t": c.t, "peak_step": c.step, "peak_bytes": c.total_bytes}

    split = c.bytes_of("fragmentation")
    if split >= max(MIN_FINDING_BYTES, FRAGMENTED_SHARE * c.total_bytes):
        pools = c.bytes_of("graph-pools")
        said = claims.make("fragmented-peak", split_bytes=split, graph_pool_free_bytes=pools,
                           inactive_split_bytes=capture["inactive_split"], reserved_bytes=capture.get("reserved"),
                           allocated_peak_bytes=capture.get("allocated_peak"))
        if said is not None:
            out.append(Finding(kind="fragmented-peak", bytes=split, pid=c.pid, device=c.device,
                               summary=tell("warning-fragmented-peak", **moment, claim=said),
                               evidence={**evidence, "inactive_split_bytes": split, "reserved_bytes": c.reserved_bytes,
                                         "graph_pool_free_bytes": pools},
                               remedy=FINDINGS["fragmented-peak"], claims=[words.as_json(said)]))
    temporaries = c.part("temporaries")
    # One tensor of a running function's own: a container's many (`x[*]`) are an accumulation, which
    # the leak and pause rows judge, not a temporary to free sooner.
    # Nor an attribute (`forward() local self.mask`): an object's state, which outlives the call.
    single = [h for h in (temporaries.holders if temporaries else [])
              if "[*]" not in h["name"] and "." not in h["name"].split(" local ", 1)[-1]]
    if single:
        top = single[0]
        if top["bytes"] >= max(MIN_FINDING_BYTES, TEMPORARY_SHARE * c.allocated_bytes):
            out.append(Finding(kind="temporary-peak", bytes=top["bytes"], pid=c.pid, device=c.device,
                               summary=tell("warning-temporary-peak", **moment, holder=top["name"], line=top["line"],
                                            bytes=top["bytes"]),
                               evidence={**evidence, "holder": top["name"], "line": top["line"]},
                               remedy=FINDINGS["temporary-peak"]))
    state = c.bytes_of("gradients") + c.bytes_of("optimizer-state")
    if c.in_pause and state >= max(MIN_FINDING_BYTES, STATE_SHARE * c.total_bytes):
        out.append(Finding(kind="state-at-evaluation", bytes=state, pid=c.pid, device=c.device,
                           summary=tell("warning-state-at-evaluation", **moment,
                                        gradients_bytes=c.bytes_of("gradients"),
                                        optimizer_state_bytes=c.bytes_of("optimizer-state")),
                           evidence={**evidence, "gradients_bytes": c.bytes_of("gradients"),
                                     "optimizer_state_bytes": c.bytes_of("optimizer-state")},
                           remedy=FINDINGS["state-at-evaluation"]))
    graphs = c.part("graphs-kept")
    if (graphs and (c.in_pause or not c.step)
            and graphs.bytes >= max(MIN_FINDING_BYTES, GRAPHS_SHARE * c.allocated_bytes)):
        top = graphs.holders[0] if graphs.holders else None
        kept = claims.make("graphs-kept", holder=top["name"] if top else "the program's names",
                           holder_kind="autograd-graph", bytes=graphs.bytes, running_step=False)
        out.append(Finding(kind="avoidable-peak", bytes=graphs.bytes, pid=c.pid, device=c.device,
                           claims=[words.as_json(kept)] if kept else [],
                           summary=tell("warning-graphs-kept", **moment, holder=top, bytes=graphs.bytes,
                                        in_pause=c.in_pause),
                           evidence={**evidence, "holder": top["name"] if top else None,
                                     "line": top["line"] if top else None},
                           remedy=FINDINGS["graphs-at-peak"]))
    return out
