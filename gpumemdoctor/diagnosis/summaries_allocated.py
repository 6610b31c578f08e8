"""The words of a peak's findings: at PyTorch's allocated peak (allocated_peak.py: how each part of its
split was told, its notes, the gathered tensors and the concatenations it found) and the peaks that
could be lower (peak_warnings.py). Pure.

The same registry as summaries.py's (summaries_registry.py): each sentence a registered function, its
keyword arguments the facts allocated_peak.py and peak_warnings.py decided; `tell(name, **facts)` makes it.
"""
from __future__ import annotations

from . import words
from .claims import Claim
from .summaries_peak import graph_words
from .summaries_registry import summary as _summary
from ..units import format_bytes as fb

# How each part of the split at PyTorch's allocated peak was told (allocated_peak.py).
HOW = {
    "parameters": "the storages of the optimizers' parameter groups",
    "gradients": "the .grad of those parameters, or made in backward() and kept after it ended",
    "optimizer-state": "the optimizers' state (AdamW: exp_avg and exp_avg_sq)",
    "activations": "made outside backward() and freed while a later backward() ran: saved by a forward for its "
                   "backward",
    "gathered": "made outside backward() with no backward() after them, held as long as the oldest of them and "
                "freed since: an evaluation's graphs or gathered outputs, a concatenation's pieces and its result",
    "temporaries": "made and freed within one part of a step: a forward's before its backward(), backward()'s "
                   "own (the gradients of activations), an optimizer step's, or made after the gathered tensors "
                   "and freed before them",
    "kept-tensors": "allocated before this moment and still allocated when it was read, not the optimizers'",
    "unclassified": "made before the recorded events began and freed since",
    "cache": "reserved by PyTorch then and not allocated: free for its next allocations",
    "request": "the allocation PyTorch could not serve at the out-of-memory error: the moment's need, never allocated",
    "context": "the CUDA context, read at the process's first allocation",
    "outside-pytorch": "NVML's figure for the process less the context and PyTorch's reserved memory, at the "
                       "nearest reading",
}
# The activations at an out-of-memory error's moment.
ERROR_HOW = ("made outside backward() in the step running at the out-of-memory error, with grad mode on, and "
             "freed as the error unwound: that step's activations (what its forward saved) and temporaries, at "
             "its input's shape")

# The notes that need no figure.
INCOMPLETE = ("PyTorch's allocation events did not reach back to its allocated peak (more events between two "
              "samples than the ring kept): that peak is not split")
NO_BACKWARD_MARK = "backward() could not be marked in this PyTorch: activations and temporaries are not told apart"
# What the gathered tensors' finding could not see (claims.not_seen's what and why), where autograd was not seen.
AUTOGRAD_UNSEEN = ("whether autograd kept them", "no probe or holder search near the peak found an autograd graph "
                   "holding memory, and the allocator's events do not say")


def _moment(where: str, total_bytes: int, step: int | None, how: str) -> str:
    """'At the peak of process 12 on GPU 0 (3.0 GiB, step 40, between two samples)'."""
    return f"At the peak of {where} ({fb(total_bytes)}{f', step {step}' if step else ''}{how})"


# -- the split's notes (allocated_peak.py) ------------------------------------------------------

@_summary("allocated-split")
def _allocated_split(allocated_bytes: int, before_s: float, phase: str) -> str:
    """Where the split was made: its peak, how long before the reading, and in what part of a step."""
    return (f"split at PyTorch's allocated peak, {fb(allocated_bytes)}, from its allocation events walked back from a "
            f"reading {before_s:.3f} s later; it came {words.PHASES[phase]}")


@_summary("allocated-below-counter")
def _allocated_below_counter(short_bytes: int, counter_bytes: int) -> str:
    return (f"the events' highest moment is {fb(short_bytes)} below PyTorch's allocated peak counter "
            f"({fb(counter_bytes)}): that much was allocated then that the events do not show")


@_summary("allocated-at-error")
def _allocated_at_error(at: str | None, request_bytes: int, inputs: list, earlier: list) -> str:
    """The note at an out-of-memory error's moment: the request, the step's `inputs` (name, shape, _),
    and the `earlier` steps' other shapes (name, shape, steps)."""
    note = (f"the out-of-memory error at {at or 'its line'} is the run's peak: what was allocated then "
            f"and the {fb(request_bytes)} it asked for")
    if inputs:
        note += "; this step's input: " + ", ".join(f"{n} {words.shape_words(s)}" for n, s, _ in inputs)
        if earlier:
            note += "; the steps before it were given at most " + ", ".join(
                f"{n} {words.shape_words(s)} ({k} step{'s' if k != 1 else ''})" for n, s, k in earlier)
    return note


@_summary("allocated-saved-by")
def _allocated_saved_by(step: int, outside_bytes: int | None, called_at: str | None) -> str:
    """Where the activations' modules come from: the step recorded with module hooks (`step`, counted
    from 1), what no module made, the line that called the outermost forward."""
    outside = f"; {fb(outside_bytes)} made with no module running" if outside_bytes else ""
    called = f"; the outermost forward called at {called_at}" if called_at else ""
    return (f"activations by the module whose forward made them, in step {step} (module hooks for that "
            f"step){outside}{called}")


@_summary("allocated-holders-probed")
def _allocated_holders_probed(before_s: float) -> str:
    return (f"its holders as the probe of the program's names found them {before_s:.3f} s "
            "before it, in the same step")


@_summary("allocated-graph-after")
def _allocated_graph_after(after_s: float, graph: dict) -> str:
    """What kept the gathered tensors, as a probe after the peak found it."""
    return (f"what kept the gathered tensors: the probe of the program's names "
            f"{after_s:.3f} s after the peak, in the same step, found {graph['path']} "
            f"carrying {graph_words(graph)}")


@_summary("autograd-probed")
def _autograd_probed(graph: dict) -> str:
    return f"the probe of the program's names found {graph['path']} carrying {graph_words(graph)}"


@_summary("autograd-searched")
def _autograd_searched(t: float, path: str) -> str:
    return f"the holder search at {t:.1f} s found memory held through {path}"


# -- the findings at the allocated peak (allocated_peak.py) -------------------------------------

@_summary("allocated-concatenation")
def _allocated_concatenation(where: str, total_bytes: int, step: int | None, concatenation: Claim | None,
                             joined: dict, pieces: dict | None, grown: list[int], cache_bytes: int | None,
                             loop: str | None, called_at: str | None, loop_holder: str | None) -> str:
    """A concatenation made while its pieces were held: the claim's words (or the `joined` record's
    figures), who held the pieces, the results `grown` reading after reading (and the cache beside
    them), the library `loop` the reading came in and the name there that held the result."""
    joined_words = words.say(concatenation) if concatenation is not None else (
        f"a tensor of {fb(joined['bytes'])} was made while {joined['pieces']} tensors made before it were held")
    held_by = ""
    if pieces is not None:
        held_by = f"; the pieces were held by {pieces['name']}" + (f" ({pieces['line']})" if pieces["line"] else "")
    said = ""
    if grown:
        said = (f"; the concatenation's result grew reading after reading ({len(grown)} readings: "
                f"{fb(grown[0])} to {fb(grown[-1])}), each larger result needing new memory while the "
                "smaller ones freed before it stayed in PyTorch's cache")
    if cache_bytes is not None:
        said += f" ({fb(cache_bytes)} of cache at this moment)"
    if loop is not None:
        said += f"; the reading came while {loop} ran" + (f", called at {called_at}" if called_at else "")
        if loop_holder:
            said += f"; at the reading the result was held by {loop_holder} (the line the loop was on)"
    return f"{_moment(where, total_bytes, step, ', between two samples')}, {joined_words}{held_by}{said}"


@_summary("allocated-gathered")
def _allocated_gathered(where: str, total_bytes: int, step: int | None, gathered_bytes: int, blocks: int,
                        first_before_s: float | None, last_before_s: float | None, loop_claim: Claim | None,
                        loop_joined: dict | None, reading_t: float, graphs: Claim | None, unseen: Claim | None) -> str:
    """Tensors gathered with no backward() after them: over the time between the first and the last
    (before the reading), in a library's loop (`loop_claim`, and what an earlier reading in it found:
    `loop_joined`), and whether autograd kept them (`graphs`, or what was `unseen`)."""
    span = ""
    if first_before_s is not None and last_before_s is not None:
        span = f" over {(first_before_s - last_before_s) * 1000:.0f} ms"
    in_loop = ""
    if loop_claim is not None:
        earlier = ""
        if loop_joined is not None:
            held = f", its result held by {loop_joined['holder']}" if loop_joined["holder"] else ""
            earlier = (f"; a reading {reading_t - loop_joined['t']:.1f} s earlier in that loop found a tensor of "
                       f"{fb(loop_joined['bytes'])} concatenated from the {loop_joined['pieces']} before it{held}: "
                       "the loop gathering batch after batch")
        in_loop = f"; {words.say(loop_claim)}{earlier}"
    if graphs is not None:
        how = f", {words.say(graphs)}, until its result is dropped (outputs kept in a list do the same)"
    else:
        how = f". {words.sentence(words.say(unseen))[:-1]}"
    return (f"{_moment(where, total_bytes, step, ', between two samples')}, {fb(gathered_bytes)} in {blocks} "
            f"tensors had been gathered{span} with no backward() after them, and were let go of together after "
            f"it{in_loop}{how}")


# -- the peaks that could be lower (peak_warnings.py) -------------------------------------------

def _warning_moment(where: str, total_bytes: int, step: int | None, highest: bool) -> str:
    return _moment(where, total_bytes, step, ", the reading with the most memory in use" if highest else "")


@_summary("warning-fragmented-peak")
def _warning_fragmented_peak(where: str, total_bytes: int, step: int | None, highest: bool, claim: Claim) -> str:
    return f"{_warning_moment(where, total_bytes, step, highest)}, {words.say(claim)}"


@_summary("warning-temporary-peak")
def _warning_temporary_peak(where: str, total_bytes: int, step: int | None, highest: bool, holder: str,
                            line: str | None, bytes: int) -> str:
    at = f" ({line})" if line else ""
    return f"{_warning_moment(where, total_bytes, step, highest)}, {holder}{at} held {fb(bytes)} of its own"


@_summary("warning-state-at-evaluation")
def _warning_state_at_evaluation(where: str, total_bytes: int, step: int | None, highest: bool,
                                 gradients_bytes: int, optimizer_state_bytes: int) -> str:
    return (f"{_warning_moment(where, total_bytes, step, highest)}, during a pause in the steps (an evaluation, a "
            f"validation), gradients ({fb(gradients_bytes)}) and optimizer state ({fb(optimizer_state_bytes)}) "
            "were held")


@_summary("warning-graphs-kept")
def _warning_graphs_kept(where: str, total_bytes: int, step: int | None, highest: bool, holder: dict | None,
                         bytes: int, in_pause: bool) -> str:
    """Autograd graphs kept by the program's names (the largest `holder`, if any) in a pause, or in a
    program that marks no steps."""
    held = f" by {holder['name']}" + (f" ({holder['line']})" if holder["line"] else "") if holder else ""
    return (f"{_warning_moment(where, total_bytes, step, highest)}, autograd graphs held{held} kept {fb(bytes)} of "
            "saved tensors, " + ("during a pause in the steps (an evaluation, a validation, the work after the last "
                                 "step)" if in_pause else "in a program that marks no steps"))
