"""The one place where claims (claims.py) become words: `say` gives each claim's sentence, from its
evidence alone. The findings' summaries are made of these sentences where they say what a claim
says, so a sentence and the figures it rests on cannot part. Pure."""
from __future__ import annotations

from .claims import Claim
from ..units import format_bytes as fb

# What each part of fit.py's is, in a sentence: {holder} the pattern that held it, where there is one.
PART_WORDS = {
    "gradients": "the gradients that the optimizers' parameters still held, no step running",
    "graphs": "the autograd graphs kept through {holder}",
    "fragmentation": "the free memory in pieces inside PyTorch's segments",
    "kept": "the tensors kept in {holder}",
    "other-processes": "the memory of the other processes on the GPU",
    "optimizer-state": "the optimizers' state, no step running",
}


def limit_words(limit_bytes: int, source: str | None) -> str:
    """'the GPU' or 'the 20.0 GiB its memory fraction allows': the limit in force, as a reader knows it."""
    if source == "memory-fraction":
        return f"the {fb(limit_bytes)} its memory fraction allows (torch.cuda.set_per_process_memory_fraction)"
    return f"the GPU's {fb(limit_bytes)}"


def part_words(e: dict) -> str:
    return PART_WORDS[e["part"]].format(holder=e.get("holder") or "the program's names")


def _headroom(e: dict) -> str:
    """' under the 20.0 GiB its memory fraction allows ...' where a fraction limits the process; else ''."""
    return (f" under {limit_words(e['limit_bytes'], e.get('limit_source'))}"
            if e.get("limit_source") == "memory-fraction" else "")


def as_json(claim: Claim) -> dict:
    """A claim as the report keeps it: its name, its evidence and its words."""
    return {"claim": claim.name, "evidence": claim.evidence, "says": say(claim)}


def say(claim: Claim) -> str:
    """The claim's sentence (no capital, no full stop: it is part of a finding's sentences)."""
    e = claim.evidence
    return SAY[claim.name](e)


def sentence(text: str) -> str:
    """A claim's words as a sentence of their own: a capital, a full stop."""
    text = text.rstrip(".")  # (a reason quoted at its end may bring its own)
    return text[:1].upper() + text[1:] + "."


def _earlier_inputs(earlier: list | None, now: list) -> str:
    """'; the steps before it were given at most input_ids 24 x 512 (30 steps)': the largest input of
    each name the earlier steps' first module call was given, where it differs from this step's."""
    if not earlier:
        return ""
    shapes = {name: shape for name, shape, _ in now}
    differ = [(name, shape, steps) for name, shape, _, steps in earlier if shapes.get(name) != shape]
    if not differ:
        return "; the steps before it were given the same shapes"
    return "; the steps before it were given at most " + ", ".join(
        f"{name} {_shape(shape)} ({steps} step{'s' if steps != 1 else ''})" for name, shape, steps in differ)


def alike(a: dict) -> str:
    """`40 tensors of 64.0 MiB each` / `80 tensors, 72 of them 4.00 MiB`: an accumulation's (or
    unheld allocations') count and sizes."""
    sizes = a.get("sizes") or []
    what = "tensors" if "pattern" in a else "allocations"
    if sizes and sizes[0][1] == a["count"]:
        return f"{a['count']} {what} of {fb(sizes[0][0])} each"
    if sizes:
        return f"{a['count']} {what}, {sizes[0][1]} of them {fb(sizes[0][0])}"
    return f"{a['count']} {what}"


def at_line(line: str | None, thread: str) -> str:
    """'train.py:40 in thread loader': where an error came, the program's own line."""
    return (line or "an unknown line") + (f" in thread {thread}" if thread != "MainThread" else "")


def shape_words(shape) -> str:
    """'24 x 4096': a tensor's shape as the findings write it."""
    return _shape(shape)


def _shape(shape) -> str:
    return " x ".join(str(n) for n in shape) if isinstance(shape, (list, tuple)) else str(shape)


SAY = {
    "request-too-large": lambda e: (f"the request alone ({fb(e['request_bytes'])}) is larger than "
                                    f"{limit_words(e['limit_bytes'], e.get('limit_source'))}, all the process may use"),
    "fragmented": lambda e: (f"PyTorch held {fb(e['free_in_segments_bytes'])} free inside its segments, enough for "
                             f"the {fb(e['request_bytes'])} request together, but in pieces of at most "
                             f"{fb(e['largest_free_block_bytes'])}, and a new segment could have only "
                             f"{fb(e['headroom_bytes'])}{_headroom(e)}: the cache is fragmented"),
    "other-processes": lambda e: f"other processes held {fb(e['others_bytes'])} of the GPU",
    "accumulation-filled": lambda e: (f"{fb(e['bytes'])} of the {fb(e['allocated_bytes'])} allocated was held by "
                                      f"{e['pattern']}: an accumulation of tensors had filled the GPU (see the leak "
                                      "finding)"),
    "own-memory-full": lambda e: (f"the program's own tensors ({fb(e['allocated_bytes'])} allocated) and cache "
                                  + (f"filled {limit_words(e['limit_bytes'], e['limit_source'])}: "
                                     if e.get("limit_source") == "memory-fraction" else "filled the GPU: ")
                                  + f"{fb(e['headroom_bytes'])} was left for the {fb(e['request_bytes'])} asked for"),
    "larger-step": lambda e: (f"the step running at the error (after {e['step']}) needed at least {fb(e['needed_bytes'])} (what it had allocated "
                              f"and the request), {e['needed_bytes'] / max(e['earlier_peak_bytes'], 1):.1f} times the "
                              f"{fb(e['earlier_peak_bytes'])} that the {e['steps_before']} steps before it reached at "
                              "most: this step was asked for more than any before it"),
    "inputs-at-error": lambda e: ("its input then: " + ", ".join(f"{name} {_shape(shape)} ({dtype})"
                                                                 for name, shape, dtype in e["inputs"])
                                  + _earlier_inputs(e.get("earlier_inputs"), e["inputs"])),
    "split-not-the-cause": lambda e: (f"PyTorch also held {fb(e['free_in_segments_bytes'])} free inside its segments, "
                                      f"in pieces of at most {fb(e['largest_free_block_bytes'])}: as one piece they "
                                      f"would have served the {fb(e['request_bytes'])} request, but they are less "
                                      f"than the {fb(e['step_excess_bytes'])} this step needed beyond the earlier "
                                      "steps' peak, so the step, not the split, used up the limit"),
    "would-have-fit": lambda e: (f"freeing {part_words(e)} ({fb(e['part_bytes'])}) would have left about "
                                 f"{fb(e['free_then_bytes'])} free{_headroom(e)}, enough for the "
                                 f"{fb(e['request_bytes'])} asked for (an estimate from the figures at the error)"),
    "would-fall-short": lambda e: (f"the largest part the program could have freed is {part_words(e)} "
                                   f"({fb(e['part_bytes'])}): alone it would have left about "
                                   f"{fb(e['free_then_bytes'])} free{_headroom(e)}, "
                                   f"{fb(e['request_bytes'] - e['free_then_bytes'])} short of the "
                                   f"{fb(e['request_bytes'])} asked for"),
    "graphs-kept": lambda e: f"autograd graphs held by {e['holder']} kept {fb(e['bytes'])} of saved tensors",
    "without-no-grad": lambda e: ("as an evaluation without torch.no_grad() does: it keeps each batch's autograd "
                                  f"graph, and what its forward saved ({e['autograd']})"),
    "gathered": lambda e: (f"{fb(e['bytes'])} in {e['blocks']} tensors had been gathered with no backward() after "
                           "them, and were let go of together after it"),
    "concatenation": lambda e: (f"a tensor of {fb(e['bytes'])} was made while the {e['pieces']} tensors made before "
                                f"it, as large together ({fb(e['pieces_bytes'])}), were still held: a concatenation "
                                "(torch.cat, torch.stack) of them, the pieces and the whole allocated at once"),
    "library-loop": lambda e: (f"the reading came while {e['loop']} ran"
                               + (f", called at {e['called_at']}" if e.get("called_at") else "")),
    "fragmented-peak": lambda e: (f"{fb(e['split_bytes'])} was free memory split inside the allocator's segments, "
                                  "too small in pieces to serve larger requests"
                                  + (f" (the {fb(e['graph_pool_free_bytes'])} free inside CUDA graphs' private pools "
                                     "left out: that is the graphs' memory)" if e["graph_pool_free_bytes"] else "")),
    "graph-pools": lambda e: (f"{e['graphs']} CUDA graph{'s' if e['graphs'] != 1 else ''} held "
                              f"{fb(e['pool_bytes'])} in their private memory pools"
                              + (f" ({fb(e['pool_bytes'] // e['graphs'])} a graph on average)" if e["graphs"] > 1 else "")
                              + ", reserved for their replays "
                              f"({fb(e['pool_allocated_bytes'])} of it their outputs): the graphs' memory, counted "
                              "with them"),
    "released-after-the-loop": lambda e: (f"it was let go of {e['t'] - e['after_t']:.1f} s after the loop's last "
                                          f"step ({e['how']})"),
    "held-until-shutdown": lambda e: ("it was still held when the program ended: the exit probes read it before the "
                                      "interpreter's shutdown"
                                      + (f", which then joined {e['threads_joined']} thread"
                                         f"{'s' if e['threads_joined'] != 1 else ''} (concurrent.futures' and "
                                         "threading's exit joins) and freed what they held" if e["threads_joined"]
                                         else "")),
    "decided-by-structure": lambda e: (f"{e['count']} alike tensors held by {e['pattern']}"
                                       + (", allocated at one line" if e["same_line"] else "")
                                       + (", one more at each step" if e["one_a_step"] else "")
                                       + (", most of them made after the run's first third" if
                                          e.get("rose_after_first_third") else "")),
    "time-to-full": lambda e: (f"at {fb(e['rate_bytes_per_s'])}/s the {fb(e['free_bytes'])} left"
                               + _headroom(e) + " would be gone in "
                               f"{e['free_bytes'] / e['rate_bytes_per_s']:.0f} s"),
    "not-seen": lambda e: f"{e['what']} was not seen: {e['why']}",
}


# -- the words the reporters share with the findings (reporters/ import these, nothing else of diagnosis/'s words)

# When PyTorch's allocated peak came, by the phase of its allocation events (allocated_peak.py).
PHASES = {"backward": "inside backward()", "optimizer step": "inside an optimizer step",
          "outside": "outside backward() and the optimizer steps (a forward, an evaluation, the program's own code)"}


def gave_up_text(gave_up: str) -> str:
    """A search's `gave_up` as the report says it: this version's say how they stopped ("stopped
    at its 1 s budget ...", "reached the end of ..."); an older report's get "gave up" before."""
    return gave_up if gave_up.startswith(("stopped", "reached")) else f"gave up {gave_up}"


def unclassified_told(part) -> str:
    """What is known of an unclassified part, in a few words: its one holder (cuBLAS's workspaces at
    exit) and where the rest was read, the end of the `how` that _unclassified_how wrote."""
    said = [f"{h['name']} {fb(h['bytes'])}" for h in part.holders[:1]]
    at = [i for i in (part.how.find("; read "), part.how.find("; the rest read ")) if i >= 0]
    if at:
        said.append(part.how[min(at) + 2:])
    return "; ".join(said)


def rate_words(g) -> str:
    """A growth's rate (a findings.Growth): '64.0 MiB per step and 1.2 GiB per second (from step 12)'."""
    parts = []
    if g.rate_bytes_per_step is not None:
        parts.append(f"{fb(int(g.rate_bytes_per_step))} per step")
    if g.rate_bytes_per_s is not None:
        parts.append(f"{fb(int(g.rate_bytes_per_s))} per second")
    start = f"from step {g.start_step}" if g.start_step is not None else (
        f"from {g.start_t:.1f} s" if g.start_t is not None else "")
    return " (".join([" and ".join(parts) or "steadily", start + ")"]) if start else " and ".join(parts)
