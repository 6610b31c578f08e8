"""What a finding claims, each claim with the observed figures it rests on. Pure.

A finding says things a user acts on: a cause, a remedy, "would have fit", "enough for the request",
"an evaluation without torch.no_grad()", "fragmented", "graphs kept", "released at its end", a
library's switch. Each of them is a `Claim` here: a name from CLAIMS and the evidence it rests on,
figures read from the recording. A rule makes a claim only where its evidence is in the recording
(`make` refuses a claim whose evidence is missing or does not bear it out); where the evidence is
missing, the finding says what was not seen (`not_seen`) instead of guessing. The claims go into the
finding's JSON beside its sentences (`Finding.claims`, as words.as_json writes them), and words.py is
the one place that turns them into words.

`check` reads a claim as the report keeps it and says where its evidence does not bear it out; tests
walk every recording with it (tests/test_claims.py), and docs/verdicts.md lists the claims and their
evidence ("Claims and their evidence").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..contract import PEAK_MIN_BYTES

# A few bytes of slack in comparisons of figures read at one moment (rounding of 512-byte blocks).
SLACK_BYTES = 1 << 20


@dataclass(frozen=True)
class Claim:
    """One thing a finding says, and the figures it rests on."""

    name: str
    evidence: dict


@dataclass(frozen=True)
class Kind:
    """A kind of claim: the evidence it needs (keys of its evidence that must be there and not null),
    what that evidence is, in a reader's words (docs/verdicts.md), and the check that the figures bear
    it out: None when they do, else why not."""

    needs: tuple[str, ...]
    rests_on: str
    check: Callable[[dict], str | None]


def _always(_: dict) -> str | None:
    return None


def _enough_in_pieces(e: dict) -> str | None:
    if e["free_in_segments_bytes"] + SLACK_BYTES < e["request_bytes"]:
        return "the free pieces do not add up to the request"
    if e["largest_free_block_bytes"] >= e["request_bytes"]:
        return "a free piece was large enough for the request: not fragmentation"
    excess = e.get("step_excess_bytes")
    if excess is not None and excess > e["free_in_segments_bytes"]:
        return "the running step needed more beyond the earlier steps' peak than the free pieces hold: not fragmentation"
    return None


def _split_too_small(e: dict) -> str | None:
    if e["largest_free_block_bytes"] >= e["request_bytes"]:
        return "a free piece was large enough for the request"
    if e["step_excess_bytes"] <= e["free_in_segments_bytes"]:
        return "the free pieces hold more than the step needed beyond the earlier steps' peak: fragmentation"
    return None


def _too_large(e: dict) -> str | None:
    return None if e["request_bytes"] > e["limit_bytes"] else "the request is within the limit in force"


def _within_limit(e: dict) -> str | None:
    if e["free_then_bytes"] > e["limit_bytes"] + SLACK_BYTES:
        return "the memory it would have left free is above the limit in force"
    if e["headroom_bytes"] > e["limit_bytes"] + SLACK_BYTES:
        return "the headroom is above the limit in force"
    if abs(e["free_then_bytes"] - e["headroom_bytes"] - e["part_bytes"]) > SLACK_BYTES:
        return "what it would have left is not the headroom and the part together"
    return None


def _fits(e: dict) -> str | None:
    return _within_limit(e) or (None if e["free_then_bytes"] >= e["request_bytes"]
                                else "what it would have left is less than the request")


def _falls_short(e: dict) -> str | None:
    return _within_limit(e) or (None if e["free_then_bytes"] < e["request_bytes"]
                                else "it would have fit: not short")


def _kept_graphs(e: dict) -> str | None:
    if e["holder_kind"] != "autograd-graph":
        return "the holder is not an autograd graph"
    if e["running_step"]:
        return "the graphs are the running step's activations, not graphs kept after it"
    return None


def _autograd_seen(e: dict) -> str | None:
    if not e["autograd"]:
        return "no autograd evidence: no graph was found holding the memory and grad mode was not read on"
    return None


def _concatenation(e: dict) -> str | None:
    if e["pieces"] < 2 or not e["pieces_live_at_peak"]:
        return "not a concatenation of pieces still held"
    if abs(e["pieces_bytes"] - e["bytes"]) > max(SLACK_BYTES, e["bytes"] // 10):
        return "the pieces are not as large as the result together"
    return None


def _library_loop(e: dict) -> str | None:
    from .remedies import LIBRARY_LOOPS

    return None if e["loop"] in LIBRARY_LOOPS else f"{e['loop']} is not a library loop with a switch"


def _time_to_full(e: dict) -> str | None:
    if e["limit_bytes"] is not None and e["free_bytes"] > e["limit_bytes"] + SLACK_BYTES:
        return "the free memory it counts is above the limit in force"
    return None if e["rate_bytes_per_s"] > 0 else "no growth to fill it"


def _fragmented_peak(e: dict) -> str | None:
    if e["split_bytes"] + e["graph_pool_free_bytes"] > e["inactive_split_bytes"] + SLACK_BYTES:
        return "more was called split than the allocator's split memory"
    # Split free pieces cost memory only where the allocator reserved beyond PyTorch's allocated peak
    # counter (by a peak part's least, PEAK_MIN_BYTES): within it they are the peak's own tensors,
    # freed (a metric's compute(), H200: 704 MiB split at one reading, 18 MiB reserved beyond the peak).
    reserved, peak = e.get("reserved_bytes"), e.get("allocated_peak_bytes")
    if reserved is not None and peak is not None and reserved - peak < PEAK_MIN_BYTES:
        return "the allocator never reserved much beyond what was allocated at once: the split pieces were its peak's own"
    return None


def _graph_pools(e: dict) -> str | None:
    return None if e["pool_bytes"] > 0 and e["graphs"] >= 1 else "no graph's private pool was measured"


def _accumulation_filled(e: dict) -> str | None:
    return None if e["bytes"] >= e["share"] * e["allocated_bytes"] else "the accumulation is less than its share"


def _released(e: dict) -> str | None:
    return None if e["how"] in ("after-the-loop", "gc-at-exit", "gc-during-run") else f"unknown release {e['how']}"


def _at_shutdown(e: dict) -> str | None:
    return None if e["before_shutdown"] else "the exit probes ran after the interpreter's shutdown"


def _structure(e: dict) -> str | None:
    if e["count"] < e["min_count"]:
        return "fewer alike tensors than the rule needs"
    if not e["same_line"]:
        return "not allocated at one line"
    if not (e["one_a_step"] or e.get("rose_after_first_third")):
        return "neither one a step nor made through the run"
    return None


def _larger_step(e: dict) -> str | None:
    if not e["steps_before"]:
        return "no step came before it"
    return None if e["needed_bytes"] > e["earlier_peak_bytes"] else "the step needed no more than the steps before"


def _inputs(e: dict) -> str | None:
    return None if e["inputs"] else "no inputs were read"


def _other_processes(e: dict) -> str | None:
    return None if e["others_bytes"] >= e["share"] * e["limit_bytes"] else "the other processes hold too little"


def _not_seen(e: dict) -> str | None:
    return None if e["what"] and e["why"] else "says nothing of what was not seen"


CLAIMS: dict[str, Kind] = {
    # -- out of memory: the cause ------------------------------------------------------------------------
    "request-too-large": Kind(("request_bytes", "limit_bytes"),
                              "the error's request against the limit in force (the device, or the per-process "
                              "memory fraction)", _too_large),
    "fragmented": Kind(("request_bytes", "free_in_segments_bytes", "largest_free_block_bytes", "headroom_bytes"),
                       "the free pieces inside PyTorch's segments at the error, read from its snapshot: together at "
                       "least the request, none as large, and more than a running step needed beyond the earlier "
                       "steps' peak (`step_excess_bytes`, where a step was asked for more)", _enough_in_pieces),
    "split-not-the-cause": Kind(("request_bytes", "free_in_segments_bytes", "largest_free_block_bytes",
                                 "step_excess_bytes"),
                                "the free pieces at the error against what the running step needed beyond the "
                                "earlier steps' allocated peak: less than that, so the step, not the split, used up "
                                "the limit", _split_too_small),
    "other-processes": Kind(("others_bytes", "limit_bytes", "share"),
                            "NVML's figures for the other processes on the GPU at the error", _other_processes),
    "accumulation-filled": Kind(("pattern", "bytes", "allocated_bytes", "share"),
                                "the holder search at the error: one holder pattern's alike tensors against the "
                                "allocated memory then", _accumulation_filled),
    "own-memory-full": Kind(("allocated_bytes", "request_bytes", "headroom_bytes", "limit_bytes"),
                            "the allocated memory and the headroom under the limit in force at the error", _always),
    "larger-step": Kind(("step", "needed_bytes", "earlier_peak_bytes", "steps_before"),
                        "the allocated memory at the error and the request, against PyTorch's allocated peak counter "
                        "at the last sample of the steps before it", _larger_step),
    "inputs-at-error": Kind(("inputs",), "the tensors passed to the outermost module's forward on the stack at the "
                                         "error, read by the agent's out-of-memory observer", _inputs),
    # -- out of memory: what would have made it fit -----------------------------------------------------
    "would-have-fit": Kind(("part", "part_bytes", "request_bytes", "headroom_bytes", "free_then_bytes", "limit_bytes"),
                           "the part the program could have freed (gradients, graphs kept, split free memory, kept "
                           "tensors, other processes, optimizer state), the headroom at the error under the limit in "
                           "force, and the request", _fits),
    "would-fall-short": Kind(("part", "part_bytes", "request_bytes", "headroom_bytes", "free_then_bytes",
                              "limit_bytes"), "as would-have-fit, for the largest part where none fits",
                             _falls_short),
    # -- autograd -----------------------------------------------------------------------------------------
    "graphs-kept": Kind(("holder", "holder_kind", "bytes", "running_step"),
                        "a holder search or probe that found the memory held through an autograd graph, and the "
                        "moment's state: not a step's forward with grad mode on (its own activations)", _kept_graphs),
    "without-no-grad": Kind(("autograd",),
                            "autograd evidence at that moment: a graph found holding the memory (a search or probe), "
                            "or grad mode read on where it was gathered", _autograd_seen),
    # -- the peak --------------------------------------------------------------------------------------------
    "gathered": Kind(("bytes", "blocks", "phase"),
                     "PyTorch's allocation events walked back to its allocated peak: tensors made outside backward() "
                     "and freed together after it", _always),
    "concatenation": Kind(("bytes", "pieces", "pieces_bytes", "pieces_live_at_peak"),
                          "the allocation events: one tensor as large as the tensors made before it, made while they "
                          "were all still allocated", _concatenation),
    "library-loop": Kind(("loop",), "the main thread's stack at a reading: inside a library loop whose own switch "
                                    "governs what it gathers", _library_loop),
    "fragmented-peak": Kind(("split_bytes", "inactive_split_bytes", "graph_pool_free_bytes"),
                            "PyTorch's inactive_split_bytes at the peak's reading, less the free memory of CUDA "
                            "graphs' private pools (the graphs', not the program's free pieces); where the reading "
                            "has them, its reserved bytes at least 256 MiB above PyTorch's allocated peak counter "
                            "(the memory the split pieces cost)", _fragmented_peak),
    "graph-pools": Kind(("pool_bytes", "graphs"),
                        "PyTorch's reserved bytes by private pool at exit, and the CUDA graphs the holder search "
                        "found", _graph_pools),
    # -- leaks ---------------------------------------------------------------------------------------------
    "released-after-the-loop": Kind(("how", "t", "after_t"),
                                    "the samples: growth to the loop's last step, then let go of at t", _released),
    "held-until-shutdown": Kind(("before_shutdown", "threads_joined"),
                                "the exit probes, read before the interpreter's shutdown joined the threads "
                                "(threading._shutdown) and ran its exit hooks", _at_shutdown),
    "decided-by-structure": Kind(("pattern", "count", "min_count", "same_line", "one_a_step"),
                                 "the exit search: alike tensors held by one holder pattern, allocated at one line, "
                                 "as many as the steps (one more at each), or, without steps, most of them made "
                                 "after the first third of the samples", _structure),
    "time-to-full": Kind(("rate_bytes_per_s", "free_bytes", "limit_bytes"),
                         "the growth's rate per second and the free memory at the last sample, under the limit in "
                         "force", _time_to_full),
    # -- what was not seen ------------------------------------------------------------------------------
    "not-seen": Kind(("what", "why"), "nothing: the finding says what it could not see, and why", _not_seen),
}


def make(name: str, **evidence) -> Claim | None:
    """The claim, where its evidence is there (no needed figure missing or null) and bears it out;
    else None: the rule then says what was not seen, never the claim."""
    kind = CLAIMS[name]
    if any(evidence.get(key) is None for key in kind.needs):
        return None
    if kind.check(evidence) is not None:
        return None
    return Claim(name, evidence)


def not_seen(what: str, why: str) -> Claim:
    """What a finding could not see, and why: said instead of a claim without evidence."""
    return Claim("not-seen", {"what": what, "why": why})


def check(claim: dict) -> str | None:
    """Where a claim as the report keeps it ({"claim", "evidence", "says"}) is not borne out by its
    evidence: an unknown claim, a needed figure missing, or its check failing; None where it is."""
    kind = CLAIMS.get(claim.get("claim"))
    if kind is None:
        return f"unknown claim {claim.get('claim')!r}"
    evidence = claim.get("evidence") or {}
    missing = [key for key in kind.needs if evidence.get(key) is None]
    if missing:
        return f"{claim['claim']}: no {', '.join(missing)} in its evidence"
    why = kind.check(evidence)
    return f"{claim['claim']}: {why}" if why else None


def present(claims: list[dict], *names: str) -> bool:
    """Whether any of these claims is among a finding's."""
    return any(c.get("claim") in names for c in claims)
