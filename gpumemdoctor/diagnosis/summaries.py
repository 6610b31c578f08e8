"""The findings' summaries, made from what the judgement's rows found. Pure.

A row (judgement.py) decides; it never words. It names the summary it found and hands over the
facts the summary is made of: figures, the records it read (an accumulation, a growth), the claims
it made (claims.py). `tell(name, **facts)` makes the sentences: SUMMARIES (summaries_registry.py)
holds one function per summary, whose keyword arguments are the facts it declares (a missing or
unknown fact is a TypeError, never a guess). A family of findings may have its own module in the
same registry (summaries_peak.py: the peak's parts and notes, the probes' holders;
summaries_allocated.py: the findings at PyTorch's allocated peak and the peaks that could be lower);
importing this one loads them all. Where a summary says what a claim says, it says it with words.py's
sentence for that claim, so that the two cannot part. The report keeps the sentences as before.
"""
from __future__ import annotations

from . import summaries_peak  # noqa: F401 (registers the peak's words)
from . import summaries_allocated  # noqa: F401
from . import summaries_ci, summaries_ranks, summaries_run, summaries_suspects  # noqa: F401
from .summaries_suspects import NO_PAUSE_SEARCH  # (judgement.py's too)
from . import words
from .summaries_registry import SUMMARIES, tell  # noqa: F401 (tell: the one entry, every family loaded)
from .summaries_registry import summary as _summary
from .words import alike, at_line
from .claims import Claim
from .remedies import FINDINGS
from ..growth import MIN_POINTS
from ..units import format_bytes as fb


# -- the phrases the summaries share -----------------------------------------------------------

def too_short(short: dict) -> str:
    """Why the samples could not judge growth (evidence.shortness: `why` and the samples' figures)."""
    what = "step samples" if short["by"] == "step" else "samples"
    n = short["samples"]
    if short["why"] == "few":
        return f"The run was too short to see growth over time ({n} {what}; judging growth needs {MIN_POINTS}),"
    if short["why"] == "unseen":
        return (f"The samples did not see the memory build up ({fb(short['unseen_bytes'])} of what was alive at "
                f"exit came after the last of {n} {what}),")
    return (f"The samples saw what was alive at exit only at the very end (the last {short['watched_after']} of "
            f"{n} {what}), too late to tell a leak from a program that ends at its peak,")


def released(g: dict, how: dict) -> str:
    """How a growth that lasted the whole loop was let go of only after it."""
    step = f" (step {how['after_step']})" if how.get("after_step") is not None else ""
    later = f"{how['t'] - how['after_t']:.1f} s later"
    said = {
        "after-the-loop": f"until the loop's last step{step}; it was let go of {later}, when what held it went "
                          "away (a function that returned, a list that was dropped)",
        "gc-at-exit": f"until the loop's last step{step}; only gc.collect() at exit freed it: reference cycles "
                      "held it (an object that refers to its owner, such as a trainer and its module)",
        "gc-during-run": f"until the loop's last step{step}; an automatic garbage collection freed it {later}: "
                         "reference cycles held it",
    }[how["how"]]
    return (f"{fb(g['grown_bytes'])} in all, {said}. It grows with the number of steps: the same loop, run "
            "longer, runs out of memory")


def collector(c: dict) -> str:
    """'The garbage collector was disabled (at exit), so ...': a collector found off (judgement.collector_off)."""
    when = ("at exit" if c.get("enabled_at_exit") is False or c.get("threshold") == 0
            else f"at {c.get('off_samples')} of its {c.get('samples')} samples")
    return f"The garbage collector was disabled ({when}), so reference cycles were never freed while it ran"


def sentences(said: list[Claim]) -> str:
    """' It was still held ... .': claims, each a sentence of its own, after a summary's."""
    return "".join(f" {words.sentence(words.say(c))}" for c in said)


# -- leaks (judgement rows 1-4, 2b) ------------------------------------------------------------

@_summary("leak-at-oom")
def _leak_at_oom(where: str, line: str | None, thread: str, allocated_bytes: int, accumulation: dict) -> str:
    a = accumulation
    return (f"{where} ran out of memory at {at_line(line, thread)}, and {fb(a['bytes'])} of the "
            f"{fb(allocated_bytes)} allocated then was {alike(a)} held by {a['pattern']}: an accumulation "
            "filled the GPU.")


@_summary("leak-by-growth")
def _leak_by_growth(where: str, growth: dict, released_how: dict | None, unsearched: str | None,
                    said: list[Claim]) -> str:
    g = growth
    if released_how is not None:
        held = released(g, released_how)
    elif g.get("retained_by") == "accumulation-at-exit":
        held = (f"{fb(g['retained_bytes'])} of alike tensors that piled up is still held at the end (the program "
                "freed other memory before it ended)")
    else:
        held = f"{fb(g['retained_bytes'])} of that growth is still held at the end"
    named = f" No search named its holder ({unsearched})." if unsearched is not None else ""
    return f"Live PyTorch tensors in {where} kept growing, {g['rate_text']}, and {held}.{named}{sentences(said)}"


@_summary("leak-by-phases")
def _leak_by_phases(where: str, kept: list[int], accumulation: dict) -> str:
    a = accumulation
    return (f"Live PyTorch tensors in {where} grew in steps, one at each of {len(kept)} pauses in the loop's "
            f"steps (an evaluation, a validation): +{', '.join(fb(k) for k in kept)}, all still held at the end, "
            f"{alike(a)} held by {a['pattern']}. Each pause adds a step: a longer run, with more evaluations, runs "
            "out of memory.")


@_summary("leak-too-short")
def _leak_too_short(where: str, total_bytes: int, accumulation: dict, short: dict) -> str:
    a = accumulation
    return (f"{fb(total_bytes)} of tensors in {where} had piled up: {alike(a)} held by {a['pattern']}. "
            f"{too_short(short)} so this accumulation, which is how a leak looks, decided.")


@_summary("leak-by-structure")
def _leak_by_structure(where: str, accumulation: dict, structure: Claim, said: list[Claim]) -> str:
    return (f"{fb(accumulation['bytes'])} of tensors in {where} had piled up: {words.say(structure)}, held at the "
            f"end. However the samples fell, that is how a leak looks: it grows with the run.{sentences(said)}")


@_summary("leak-unheld")
def _leak_unheld(where: str, total_bytes: int, unheld: dict, short: dict) -> str:
    return (f"{fb(total_bytes)} in {where} is {alike(unheld)} that no Python object holds, still allocated at "
            f"exit. {too_short(short)} so this decided: many alike allocations kept alive from C++, as a "
            "reference cycle through autograd does.")


# -- an out-of-memory error (row 5, out_of_memory.py) -----------------------------------------

# How the program went on after the error: it ended with it, it caught it, or neither is known.
OOM_ENDED = {"uncaught": " The program ended with this error.", "caught": " The program caught the error and went on.",
             None: ""}


@_summary("out-of-memory")
def _out_of_memory(where: str, line: str | None, thread: str, cause: Claim | None, ended: str | None,
                   said: list[Claim]) -> str:
    why = words.say(cause) if cause is not None else "the figures at the error do not say why"
    return f"{where} ran out of GPU memory at {at_line(line, thread)}: {why}.{OOM_ENDED[ended]}{sentences(said)}"


@_summary("oom-figures")
def _oom_figures(request_bytes: int, device_free_bytes: int | None, headroom_bytes: int, limit_bytes: int,
                 limit_source: str | None, allocated_bytes: int | None, unallocated_bytes: int | None,
                 largest_free_block_bytes: int | None, others: list[int | None]) -> str:
    """The error's figures, as the finding's evidence keeps them (`others`: what each other process held)."""
    under = f" ({words.limit_words(limit_bytes, limit_source)} in force)" if limit_source == "memory-fraction" else ""
    text = (f"Tried to allocate {fb(request_bytes)} with {fb(device_free_bytes)} free of the device and "
            f"{fb(headroom_bytes)} of room under the limit of {fb(limit_bytes)}{under}; "
            f"PyTorch had {fb(allocated_bytes)} allocated and {fb(unallocated_bytes)} reserved but unallocated "
            f"(largest free piece {fb(largest_free_block_bytes)})")
    if others:
        text += f"; {len(others)} other process{'es' if len(others) > 1 else ''} held {fb(sum(u or 0 for u in others))}"
    return text


@_summary("oom-larger-step-remedy")
def _oom_larger_step_remedy(earlier_peak_bytes: int, earlier_inputs: list, own_bytes: int | None) -> str:
    """A larger step's remedies (remedies.py's `oom-larger-step`), with the earlier steps' peak at their
    inputs and what this step had allocated beyond the optimizers' parameters, gradients and state."""
    at = (" at inputs of at most " + ", ".join(f"{name} {words.shape_words(shape)}" for name, shape in earlier_inputs)
          if earlier_inputs else "")
    mine = (f" of the {fb(own_bytes)} this step had allocated beyond the optimizers' parameters, gradients and state"
            if own_bytes is not None else "")
    return FINDINGS["oom-larger-step"].format(earlier=fb(earlier_peak_bytes), at=at, own=mine)


# -- garbage, what is still held, the peak a pause made (rows 6-8, 13) -------------------------------------

@_summary("garbage-cycle")
def _garbage_cycle(where: str, decided_by: str, at_exit_bytes: int, during_bytes: int, collections: dict,
                   also_during: bool, collector_off: dict | None) -> str:
    c = collections
    if decided_by == "gc-at-exit":
        text = (f"{fb(at_exit_bytes)} of tensors in {where} were unreachable but held by reference cycles: only "
                "the cyclic garbage collector frees them.")
    else:
        n = c.get("freeing")
        text = (f"Reference cycles in {where} held tensors until Python's garbage collector ran: {n} "
                f"collection{'s' if n != 1 else ''} during the run freed {fb(c.get('freed_bytes'))} of CUDA "
                f"memory, up to {fb(during_bytes)} at once. Nothing of it was left at exit, but until each "
                "collection it took GPU memory.")
    if also_during:
        text += f" Collections during the run also freed {fb(c.get('freed_bytes'))} (up to {fb(during_bytes)} at once)."
    return text if collector_off is None else f"{collector(collector_off)}: {text}"


@_summary("collector-disabled")
def _collector_disabled(where: str, collector_off: dict, growth: dict) -> str:
    return (f"{collector(collector_off)}: {fb(growth['grown_bytes'])} of tensors in {where} piled up in reference "
            f"cycles, {growth['rate_text']}, and only gc.collect() freed them.")


@_summary("live-at-exit")
def _live_at_exit(where: str, live_bytes: int, short: dict | None) -> str:
    why = ("They did not keep growing while the program was watched, so this is not a leak: it is"
           if short is None else f"{too_short(short)} and nothing else pointed to a leak, so this is taken as")
    return (f"{fb(live_bytes)} of tensors in {where} were still referenced when the program ended. {why} what "
            "the program still holds (a model, data, or a reference it forgot to drop), and nvidia-smi counts it "
            "until the process exits.")


@_summary("avoidable-peak")
def _avoidable_peak(where: str, rises: list[int], held: dict | None, declined: str | None,
                    searched_after_s: float | None, said: list[Claim]) -> str:
    n = len(rises)
    heights = ", ".join(fb(r) for r in rises[:6]) + (" ..." if n > 6 else "")
    at_height = ""
    if held is not None and held.get("probed"):
        at_height = (f" In the pause the probe of the program's names found {tell('probed-holder', holder=held)}; no copy of "
                     f"the process was searched there ({declined or NO_PAUSE_SEARCH}).")
    elif held is not None and searched_after_s is not None:  # the search came when it came, not at the height
        at_height = (f" A search {searched_after_s * 1000:.0f} ms after the pause's first sample found {alike(held)} "
                     f"held by {held['pattern']}.")
    elif held is not None:
        at_height = f" At its height {alike(held)} were held by {held['pattern']}."
    return (f"In {where}, memory rose during {n} pause{'s' if n > 1 else ''} in the loop's steps (an evaluation, "
            f"a validation, the work after the last step) by up to {fb(max(rises))} ({heights}), above all that "
            f"the steps had reached, and was let go of at each pause's end: not a leak, but what made the "
            f"peak.{at_height}{sentences(said)}")


# -- memory held for stream work at exit (row 15, streams.py) ---------------------------------

def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def stream_words(found: dict) -> str:
    """'side stream `side` (1.00 GiB, finished 1.93 s after the end)' for each stream the main module
    names, and the rest under one row (the agent's handle -1)."""
    parts = []
    for _, size, name, waited in found["streams"]:
        what = f"side stream `{name}`" if name else "streams the program's main module does not name"
        when = f", finished {_seconds(waited)} after the end" if waited is not None else ""
        parts.append(f"{what} ({fb(size)}{when})")
    return "; ".join(parts)


@_summary("pending-stream")
def _pending_stream(where: str, size_bytes: int, told_apart: bool, streams: list, waited_s: float) -> str:
    """Freed memory held for another stream's work at exit; `told_apart`: whether the recording tells
    unfinished work from finished work the allocator had not yet processed."""
    if not told_apart:
        return (f"{fb(size_bytes)} in {where} was freed in Python but is held until unfinished work on another "
                f"stream completes (record_stream). This recording does not tell unfinished work from "
                f"finished work the allocator had not yet processed.")
    named = stream_words({"streams": streams})
    return (f"{fb(size_bytes)} in {where} was freed in Python but still held when the program ended, for work "
            f"queued on another stream that had not finished: " + (named or f"done {_seconds(waited_s)} later")
            + " (record_stream).")


@_summary("finished-stream-work")
def _finished_stream_work(where: str, settled_bytes: int) -> str:
    """The note on finished work's blocks still counted active at exit."""
    return (f"{where}: {fb(settled_bytes)} freed in Python was still marked in use at exit for stream work that "
            f"had already finished (the allocator releases such blocks at its next allocation; FSDP and "
            f"record_stream leave them at every step): counted as cache, not as pending.")


# -- what the machine did to the run (machine_faults.py) ------------------------------------------

@_summary("host-memory-cgroup")
def _host_memory_cgroup(kills: int) -> str:
    """Killed by SIGKILL, with no host memory readings, its memory cgroup counting kills."""
    return (f"The target was killed by SIGKILL, and its memory cgroup counted {kills} out-of-memory kill(s) during "
            "the run: the kernel ended it for lack of host memory (RAM), not GPU memory.")


@_summary("host-memory")
def _host_memory(rose: bool, from_bytes: int, last_bytes: int, over_s: float, kills: int | None) -> str:
    """Killed by SIGKILL while its host memory `rose` (from_bytes to last_bytes in its last over_s)."""
    why = (f"its memory cgroup counted {kills} out-of-memory kill(s) during the run: the kernel's out-of-memory "
           "killer ended it" if kills else
           "most likely the kernel's out-of-memory killer, for host memory (RAM), not GPU memory")
    rise = f"rose from {fb(from_bytes)} to {fb(last_bytes)} in its last {over_s:.1f} s" if rose else f"was {fb(last_bytes)}"
    return f"The target was killed by SIGKILL while its host memory {rise}: {why}."


@_summary("nvml-failed")
def _nvml_failed(device: int, from_t: float, to_t: float | None, error: str, failed_calls: int) -> str:
    """One NVML outage: from when, on which GPU, what it said, and what the judgement rests on instead."""
    until = "to the end of the run" if to_t is None else f"to {to_t:.1f} s"
    after = "" if to_t is None else " and after"
    return (f"NVML failed on GPU {device} from {from_t:.1f} s {until} ({error}; {failed_calls} failed reads): the "
            "run went on; NVML figures (the process totals, the context, memory outside PyTorch) are judged on the "
            f"readings before{after} it, PyTorch's allocator figures on the whole run")


# -- memory outside PyTorch (non_torch.py; row 11's decision is "outside-pytorch" below) ----------

@_summary("non-torch")
def _non_torch(where: str, outside_bytes: int, why: str, nccl_growth: str | None, nccl_bytes: int | None) -> str:
    """`why`: "outside-pytorch"'s words; `nccl_growth`: nccl.py's, where it grew with NCCL's groups."""
    text = f"{fb(outside_bytes)} in {where} lies outside PyTorch's allocator, {why}."
    if nccl_growth is not None:
        return text + nccl_growth
    if nccl_bytes:
        text += f" {fb(nccl_bytes)} of it came with NCCL's communicators, and is not counted against that."
    return text


@_summary("non-torch-too-short")
def _non_torch_too_short(where: str, at_end_bytes: int | None, by: str, ran: float, points: int, warmup: float,
                         span: float) -> str:
    """The note on memory outside PyTorch that rose in a run too short to tell growth from warm-up."""
    unit = "steps" if by == "step" else "s"
    took = f"{ran:.0f} steps" if by == "step" else f"{ran:.1f} s"
    return (f"memory outside PyTorch in {where} ({fb(at_end_bytes)} at exit) rose while the program ran, but its "
            f"GPU work was too short to tell growth from warm-up ({took} from its first allocation; {points} "
            f"samples after a warm-up of {warmup} {unit}, where judging needs 8 over {span} {unit}): kernels and "
            "libraries load on first use, so it was not called growing")


# -- the rest of the table (rows 9, 10, 14, 16; 11, 17, 18's words) -----------------------------------

@_summary("context")
def _context(where: str, context_bytes: int) -> str:
    return f"{fb(context_bytes)} is the CUDA context of {where}: per-process overhead, not a leak."


@_summary("allocator-cache")
def _allocator_cache(where: str, cache_bytes: int) -> str:
    return (f"{fb(cache_bytes)} in {where} is PyTorch's allocator cache: memory of freed tensors kept for "
            "reuse. nvidia-smi counts it; it is not a leak.")


@_summary("end-not-seen")
def _end_not_seen(where: str, last_allocated_bytes: int, last_t: float | None, ended: dict,
                  short: dict | None) -> str:
    last = f"at its last reading ({last_t:.1f} s)" if last_t is not None else "at its last reading"
    watched = "" if short is None else f" {too_short(short)} so neither growth nor its holders can decide."
    return (f"{fb(last_allocated_bytes)} of tensors were alive in {where} {last}, and the process {ended['text']}: "
            "its exit probes and the holder search never ran, so what held them, and whether they were a leak, "
            f"is unknown.{watched}")


@_summary("no-reading")
def _no_reading(pid: int, device: int | None, nvml_bytes: int, ended: dict) -> str:
    return (f"Process {pid} on GPU {device} held {fb(nvml_bytes)} (NVML), and {ended['text']} before its agent's "
            "first reading of PyTorch's allocator: no evidence says what that memory was.")


@_summary("outside-pytorch")
def _outside_pytorch(decided_by: str, grew: str | None, peak: dict | None) -> str:
    """What the non-torch finding says of the memory outside PyTorch, by what decided it."""
    if decided_by == "growth":
        return f"and it kept growing past warm-up, {grew}"
    if decided_by == "exit":
        return "more than CUDA libraries take"
    return (f"at exit, and while the program ran it rose past warm-up by {fb(peak['rise'])}, to "
            f"{fb(peak['peak'])} (held from {peak['at']:.1f}), whatever was left at exit: memory let go of at "
            "the end still grew")
