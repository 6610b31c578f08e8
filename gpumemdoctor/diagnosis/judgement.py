"""One judgement over all the evidence about one process on one GPU. Pure.

A leak is memory a program keeps adding to. The best proof is watching it grow,
but a fast script, a crash or an out-of-memory error can end a run before the
sampler has seen enough. So each piece of evidence is weighed here, in one table,
and every finding says which evidence decided it:

| # | evidence                                                                  | finding                      | decided by        |
|---|---------------------------------------------------------------------------|------------------------------|-------------------|
| 1 | an out-of-memory error, with one accumulation (a holder pattern and the    | leak, and out-of-memory      | `out-of-memory`   |
|   | autograd graphs its tensors keep) or the growth seen over the run holding  | (cause `accumulation`)       |                   |
|   | at least half of the allocated memory at that moment                      |                              |                   |
| 2 | the allocated floor kept growing over enough samples, to the loop's last   | leak                         | `growth`          |
|   | step, and is still held, or was let go of only after that last step       |                              |                   |
| 2b| at least 2 pauses in the steps each left >= 16 MiB behind (a staircase),   | leak                         | `phases`          |
|   | still held at exit, and one accumulation at exit holds >= half of it (and  |                              |                   |
|   | at most twice it, + 64 MiB)                                                |                              |                   |
| 3 | too few samples to judge growth, and >= 8 alike tensors held the same way   | leak                         | `structure`       |
|   | (`x[*]`, kept tracebacks, a hook's closure, an autograd graph), >= 64 MiB   |                              |                   |
| 4 | too few samples, and >= 8 alike allocations nothing in Python holds,        | leak                         | `unheld`          |
|   | >= 64 MiB (a C++ reference cycle, such as backward(create_graph=True))     |                              |                   |
| 5 | an out-of-memory error not explained by row 1                              | out-of-memory (cause below)  | `out-of-memory`   |
| 6 | gc.collect() at exit freed >= 64 MiB of tensors, or one automatic          | garbage-cycle                | `gc-at-exit`,     |
|   | collection while the program ran freed >= 64 MiB                           |                              | `gc-during-run`   |
| 7 | >= 64 MiB of tensors still referenced at exit, and no leak                  | live-at-exit (informs)       | `exit`            |
| 8 | the garbage collector was disabled (gc.disable() or a threshold of 0, at    | garbage-cycle instead of the | `collector-       |
|   | exit or in half the samples), and row 2's growth was let go of only by a   | leak of row 2 (cause         | disabled`         |
|   | collection; row 6 names that cause too                                     | `collector-disabled`)        |                   |
| 9 | the process ended before its exit probes ran (os._exit, a signal), >= 64   | unknown                      | `end-not-seen`    |
|   | MiB of tensors alive at its last reading, and no row above decided         |                              |                   |
| 10| its agent saw CUDA start, and it ended hard before its first reading (no    | unknown, not non-torch       | `no-reading`      |
|   | PyTorch figures at all): NVML's figure alone (`unread`)                    |                              |                   |
| 11| memory outside PyTorch held a level past warm-up (4 readings in a row) more | non-torch, whatever was left | `peak`            |
|   | than 512 MiB above its level when warm-up ended (`outside_pytorch`)         | at exit                      |                   |
| 12| a preallocating library's pool (XLA), by its own statistics, >= 64 MiB:     | library-memory (informs);    | `library-         |
|   | not the context, not held against the 512 MiB allowance (libraries.py)     | the context without it       | statistics`       |
| 13| pauses in the steps (an evaluation, a validation) that each rose by        | avoidable-peak (warns)       | `phases`          |
|   | >= 256 MiB, above all the steps had reached, and let >= 3/4 of it go at    |                              |                   |
|   | their end                                                                  |                              |                   |
| 14| the CUDA context could be measured                                         | context (informs)            |                   |
| 15| >= 64 MiB held at exit for stream work unfinished then, run >= 0.1 s on  | pending-stream               | `unfinished-work` |
| 16| a program without steps ends with >= 64 MiB in PyTorch's cache             | allocator-cache              |                   |
| 17| memory outside PyTorch kept growing past warm-up (10 steps or 0.5 s), by    | non-torch                    | `growth`          |
|   | >= 16 MiB over >= 8 steps or 0.5 s, each stretch higher (non_torch.judge)  |                              |                   |
| 18| more than 512 MiB outside PyTorch at exit, NCCL's part (nccl.py) and other | non-torch                    | `exit`            |
|   | libraries' pools (row 12) left out                                         |                              |                   |

Rows 11, 12, 17 and 18 are about memory outside PyTorch (`outside_pytorch` decides 17, 18 and 11,
the first that applies); how it is measured and itemised is in non_torch.py, nccl.py and
libraries.py. The evidence: evidence.py. The rows decide; their summaries' words are
summaries.py's, made from the facts each row hands over (`tell`).

Rows 1-4 decide one leak finding (the first that applies). With enough samples,
watching decides: an accumulation that did not grow while the program was
watched (a dataset loaded once) is not a leak, and is shown under live-at-exit.
Row 2b reads the pauses in a loop's steps (phases.py): growth that comes in steps,
one at each evaluation, has no steady slope for row 2. An accumulation that a pause
lets go of at its end, reaching its height again at the next, is row 13: part of
the peak, never a leak. Something filled once (a dataset, a ring) adds at most one
step: not a staircase.

An out-of-memory error's cause (row 5; out_of_memory.py words it and what would have made it fit):
`request-too-large` (the request alone is more than the limit in force: the device, or the memory
fraction the program may use), `fragmentation` (the allocator's free pieces alone add up to the
request but none is big enough, and they hold more than a running step needed beyond the earlier
steps' peak), `accumulation` (row 1's, the running step's own activations left out), `other-processes` (other processes hold
what would have served it, and the limit in force had room), else `full` (the program's own memory
filled the device, or the limit). Every claim a row makes rests on its evidence (claims.py); where a
row could not see what it would say, it says so (`not-seen`). Rows 2 and 3 also say what held memory
until the end (held.py: read before the interpreter's shutdown, CUDA graphs' pools).
"""
from __future__ import annotations

from .evidence import SIGNIFICANT_BYTES, Evidence, Judged, brief, line_of, samples_of, shortness
from .probed import suspect as probed_suspect
from . import claims, streams, summaries
from .summaries import tell
from .claims import Claim
from .held import held_claims as _held_claims, rise_rate as _rise_rate, structural as _structural
from .out_of_memory import (OOM_ACCUMULATION_SHARE, cause as _oom_cause, finding as _out_of_memory,
                            kept_at_error as _kept_at_error)
from .remedies import FINDINGS, LIBRARY_LOOPS
from .suspects import MAX_SUSPECTS, accumulation_suspect, unheld_suspect
from ..contract import MIN_GROWTH_BYTES as MIN_LEAK_BYTES, PEAK_MIN_BYTES  # the agent's phase watch's too

# Row 2b, a staircase: pauses that each left at least STAIR_MIN_BYTES behind, at least MIN_STAIRS of
# them, still held at exit, an accumulation at exit holding at least STAIR_HELD_SHARE of the steps.
STAIR_MIN_BYTES = MIN_LEAK_BYTES
MIN_STAIRS = 2
STAIR_HELD_SHARE = 0.5
STAIR_MAX_SHARE = 2  # an accumulation over twice what the steps kept (and 64 MiB) is not theirs
# Row 13, a peak bound to a phase: a pause that rose by PEAK_MIN_BYTES and kept at most
# BOUND_KEPT_SHARE of it (or MIN_LEAK_BYTES) after its end.
BOUND_KEPT_SHARE = 0.25


def judge(e: Evidence) -> list[Judged]:
    """The decision table above, row by row."""
    out: list[Judged] = []
    oom = e.ooms[0] if e.ooms else None
    cause = _oom_cause(e, oom) if oom is not None else None
    if oom is not None:
        # The search at the error is the better evidence: what was held when memory ran out.
        held = _kept_at_error(e, oom)
        leak = (_leak_at_oom(e, oom, held) if cause == "accumulation" and held
                and held[0]["bytes"] >= OOM_ACCUMULATION_SHARE * (oom["allocated_bytes"] or 0)
                else None) or _leak_by_growth(e)
    else:
        leak = _leak_by_growth(e) or _leak_by_phases(e) or _leak_by_structure(e) or _leak_unheld(e)
    if leak is not None:
        out.append(leak)
    if oom is not None:
        out.append(_out_of_memory(e, oom, cause))
    garbage = _garbage(e)
    released = (e.growth or {}).get("released") or {}
    by_collector = leak is not None and released.get("how", "").startswith("gc-")
    if by_collector and collector_off(e.collector):
        out.remove(leak)  # row 8: cycles that a disabled collector never freed are garbage, not a leak
        leak, garbage = None, _disabled_collector(e, garbage)
        by_collector = False
    if garbage is not None and not by_collector:
        out.append(garbage)  # (a leak that only the collector let go of says so itself)
    if leak is None and e.live_bytes and e.live_bytes >= SIGNIFICANT_BYTES:
        out.append(_live_at_exit(e))
    if not out and e.ended is not None and (e.last_allocated_bytes or 0) >= SIGNIFICANT_BYTES:
        out.append(_end_not_seen(e))  # row 9
    out.extend(x for x in (_phase_bound_peak(e), _context(e), _pending_stream(e), _allocator_cache(e))
               if x is not None)
    return out


# -- the leak rows ----------------------------------------------------------------

def _leak_at_oom(e: Evidence, oom: dict, held: list[dict]) -> Judged | None:
    a = held[0]
    suspects = [accumulation_suspect(x) for x in held[:MAX_SUSPECTS]]
    return Judged(
        kind="leak", bytes=a["bytes"],
        summary=tell("leak-at-oom", where=e.where, line=line_of(oom["stack"]), thread=oom["thread"],
                     allocated_bytes=oom["allocated_bytes"], accumulation=a),
        evidence={"decided_by": "out-of-memory", "accumulation": brief(a),
                  "allocated_at_error": oom["allocated_bytes"], "root_cause": e.oom_search,
                  **samples_of(e)},
        remedy=suspects[0]["remedy"], suspects=suspects)


def _leak_by_growth(e: Evidence) -> Judged | None:
    g = e.growth
    if g is None:
        return None
    released = g.get("released")
    evidence = {"decided_by": "growth", **{k: v for k, v in g.items() if k != "rate_text"}, **samples_of(e)}
    found, unsearched, remedy = [], None, ""
    if e.holders is not None:
        found, evidence["root_cause"], unsearched, remedy = e.holders.leak(released is not None)
    made: list[Claim] = []
    if released is not None:
        made.append(claims.make("released-after-the-loop", how=released.get("how"), t=released.get("t"),
                                after_t=released.get("after_t")))
    size = g["retained_bytes"] if released is None else g["grown_bytes"]
    more, size = _held_claims(e, size)
    made += more
    structure = _structural(e)  # said too where growth decided: the same claims, whichever decided
    if structure is not None:
        made.append(structure[1])
    return Judged(kind="leak", bytes=size,
                  summary=tell("leak-by-growth", where=e.where, growth=g, released_how=released,
                               unsearched=unsearched, said=more),
                  evidence=evidence, remedy=remedy, suspects=found, claims=[c for c in made if c is not None])


def _leak_by_structure(e: Evidence) -> Judged | None:
    found = _leak_at_exit(
        e, e.accumulations, "structure", "accumulations", accumulation_suspect,
        lambda total, a: tell("leak-too-short", where=e.where, total_bytes=total, accumulation=a,
                              short=shortness(e)))
    if found is not None:
        return found
    structure = _structural(e)  # the samples were enough, and their slope did not decide: the structure does
    if structure is None:
        return None
    a, made = structure
    more, size = _held_claims(e, a["bytes"], a.get("graph_pool_bytes", 0))
    suspects = [accumulation_suspect(x) for x in e.accumulations[:MAX_SUSPECTS]]
    return Judged(kind="leak", bytes=size,
                  summary=tell("leak-by-structure", where=e.where, accumulation=a, structure=made, said=more),
                  evidence={"decided_by": "structure", "accumulations": [brief(x) for x in e.accumulations],
                            "root_cause": e.exit_search, **samples_of(e),
                            "rise_rate_bytes_per_s": _rise_rate(e, SIGNIFICANT_BYTES)},
                  remedy=suspects[0]["remedy"], suspects=suspects, claims=[made, *more])


def _leak_unheld(e: Evidence) -> Judged | None:
    return _leak_at_exit(
        e, e.unheld, "unheld", "unheld", unheld_suspect,
        lambda total, u: tell("leak-unheld", where=e.where, total_bytes=total, unheld=u, short=shortness(e)))


def _leak_at_exit(e: Evidence, found: list[dict], decided_by: str, key: str, suspect, summary) -> Judged | None:
    """Rows 3 and 4: what was held at exit decides, when the samples could not."""
    total = sum(x["bytes"] for x in found)
    if e.enough_samples or total < SIGNIFICANT_BYTES:
        return None
    suspects = [suspect(x) for x in found[:MAX_SUSPECTS]]
    return Judged(kind="leak", bytes=total, summary=summary(total, found[0]),
                  evidence={"decided_by": decided_by, key: [brief(x) for x in found],
                            "root_cause": e.exit_search, **samples_of(e)},
                  remedy=suspects[0]["remedy"], suspects=suspects)


def _leak_by_phases(e: Evidence) -> Judged | None:
    """Row 2b: a staircase. Pauses in the steps that each left memory behind, still held at exit,
    and an accumulation at exit that holds it: growth that comes one step per evaluation."""
    stairs = [p for p in e.pauses if p.kept is not None and p.kept >= STAIR_MIN_BYTES]
    if len(stairs) < MIN_STAIRS or e.live_bytes is None:
        return None
    kept = sum(p.kept for p in stairs)
    if e.live_bytes < stairs[0].before + STAIR_HELD_SHARE * kept:
        return None  # let go of before the end: not held
    # The accumulation the steps are made of: at least half of them, and not one much bigger than
    # all they kept (a dataset loaded before the first step is no step's).
    held = [a for a in e.accumulations
            if STAIR_HELD_SHARE * kept <= a["bytes"] <= STAIR_MAX_SHARE * kept + SIGNIFICANT_BYTES]
    if not held:
        return None
    a = held[0]
    suspects = [accumulation_suspect(x) for x in held[:MAX_SUSPECTS]]
    return Judged(
        kind="leak", bytes=a["bytes"],
        summary=tell("leak-by-phases", where=e.where, kept=[p.kept for p in stairs], accumulation=a),
        evidence={"decided_by": "phases", "stairs": [p.to_json() for p in stairs], "kept_bytes": kept,
                  "accumulation": brief(a), "root_cause": e.exit_search, **samples_of(e)},
        remedy=suspects[0]["remedy"], suspects=suspects)


# -- out of memory, garbage, what is still held -------------------------------------------

def _garbage(e: Evidence) -> Judged | None:
    at_exit = e.garbage_bytes or 0
    during = (e.collections or {}).get("max_freed_bytes") or 0
    if max(at_exit, during) < SIGNIFICANT_BYTES:
        return None
    decided = "gc-at-exit" if at_exit >= SIGNIFICANT_BYTES else "gc-during-run"
    off = collector_off(e.collector)
    summary = tell("garbage-cycle", where=e.where, decided_by=decided, at_exit_bytes=at_exit, during_bytes=during,
                   collections=e.collections or {},
                   also_during=during >= SIGNIFICANT_BYTES and at_exit >= SIGNIFICANT_BYTES,
                   collector_off=e.collector if off else None)
    if off:  # row 8's cause, where no growth was let go of by it
        return _garbage_cycle(e, max(at_exit, during), summary,
                              {"decided_by": decided, "cause": "collector-disabled", "collector": e.collector,
                               "garbage_at_exit_bytes": e.garbage_bytes, "collections_during_run": e.collections},
                              FINDINGS["collector-disabled"])
    return _garbage_cycle(e, max(at_exit, during), summary,
                          {"decided_by": decided, "garbage_at_exit_bytes": e.garbage_bytes,
                           "collections_during_run": e.collections}, FINDINGS["garbage-cycle"])


def _garbage_cycle(e: Evidence, size: int, summary: str, evidence: dict, remedy: str) -> Judged:
    """A garbage-cycle finding, with what gc.collect() freed at exit as its suspects."""
    found: list = []
    if e.holders is not None:
        found, evidence["garbage"] = e.holders.garbage()
        evidence.update({"allocated_at_end": e.allocated_bytes, **e.holders.after_gc()})
    return Judged(kind="garbage-cycle", bytes=size, summary=summary, evidence=evidence, remedy=remedy, suspects=found)


def _live_at_exit(e: Evidence) -> Judged:
    found, root_cause, remedy = e.holders.live() if e.holders is not None else ([], e.exit_search, "")
    more, _ = _held_claims(e, e.live_bytes)
    return Judged(
        kind="live-at-exit", bytes=e.live_bytes, claims=more,
        summary=tell("live-at-exit", where=e.where, live_bytes=e.live_bytes,
                     short=None if e.enough_samples else shortness(e)),
        evidence={"decided_by": "exit", "live_at_end_bytes": e.live_bytes, "root_cause": root_cause,
                  "accumulations": [brief(a) for a in e.accumulations], **samples_of(e)},
        remedy=remedy, suspects=found)


def _searched_after_s(search: dict | None, pause) -> float | None:
    """How long after the pause's first sample the in-run search ran, where it ran inside that pause."""
    t = (search or {}).get("t")
    if not (search or {}).get("searched") or search.get("when") != "phase" or t is None:
        return None
    return t - pause.t0 if pause.t0 <= t <= pause.t1 else None


def _phase_bound_peak(e: Evidence) -> Judged | None:
    """Row 13: pauses whose memory rose and was let go of at their end. Not a leak; the peak."""
    bound = [p for p in e.pauses if p.rise >= PEAK_MIN_BYTES and p.kept is not None
             and p.kept <= max(MIN_LEAK_BYTES, BOUND_KEPT_SHARE * p.rise)
             and (p.steps_peak is None or p.height > p.steps_peak)]
    if not bound:
        return None
    top = max(bound, key=lambda p: p.rise)
    suspects = [probed_suspect(x, phase=True) if x.get("probed") else accumulation_suspect(x, phase=True)
                for x in e.phase_accumulations[:MAX_SUSPECTS]]
    declined = (e.phase_search or {}).get("declined")
    made: list[Claim] = []  # the claims the finding makes
    said: list[Claim] = []  # those its summary says
    loop = _loop_in(e, bound)
    remedy = suspects[0]["remedy"] if suspects else None
    if loop is not None:  # a library's loop gathered it: its own switches
        made.append(loop)
        said.append(loop)
        remedy = remedy if suspects and suspects[0].get("holders") else LIBRARY_LOOPS[loop.evidence["loop"]]
    after_s = _searched_after_s(e.phase_search, top)
    if (e.phase_search or {}).get("searched") and e.phase_search.get("probed"):  # the probe saw more held
        declined = tell("phase-search-found-less", after_s=after_s)
    if not suspects:
        unseen = claims.not_seen("what held it", declined or (
            summaries.NO_PAUSE_SEARCH if after_s is None else tell("phase-search-found-nothing", after_s=after_s)))
        made.append(unseen)
        if loop is None:
            said.append(unseen)
            remedy = FINDINGS["phase-unsearched"]
    return Judged(
        kind="avoidable-peak", bytes=top.rise,
        summary=tell("avoidable-peak", where=e.where, rises=[p.rise for p in bound],
                     held=e.phase_accumulations[0] if e.phase_accumulations else None, declined=declined,
                     searched_after_s=after_s, said=said),
        evidence={"decided_by": "phases", "pauses": [p.to_json() for p in bound],
                  "highest_bytes": top.height, "root_cause": e.phase_search},
        remedy=remedy, suspects=suspects, claims=made)


def _loop_in(e: Evidence, pauses: list) -> Claim | None:
    """A library loop (remedies.LIBRARY_LOOPS) that a reading found the program in during one of
    these pauses: the library's own switches govern what it gathered."""
    for r in e.loop_readings:
        if any(p.since_s <= r["t"] <= (p.until_s if p.until_s is not None else p.t1 + 1.0) for p in pauses):
            return claims.make("library-loop", loop=r["loop"], called_at=r.get("loop_called_at"), t=r["t"])
    return None


def _context(e: Evidence) -> Judged | None:
    if not e.context_bytes:
        return None
    return Judged(kind="context", bytes=e.context_bytes,
                  summary=tell("context", where=e.where, context_bytes=e.context_bytes),
                  evidence={"context_bytes": e.context_bytes, "cuda_started_t": e.cuda_t},
                  remedy=FINDINGS["context"])


def _pending_stream(e: Evidence) -> Judged | None:
    if not e.pending_stream_bytes or e.pending_stream_bytes < SIGNIFICANT_BYTES:
        return None
    told_apart, waited = e.pending.get("pending_told_apart", False), e.pending.get("pending_wait_s") or 0
    if told_apart and waited < streams.MIN_WAIT_S:  # the last step's own work, done moments after the end
        return None
    return Judged(kind="pending-stream", bytes=e.pending_stream_bytes,
                  summary=tell("pending-stream", where=e.where, size_bytes=e.pending_stream_bytes, told_apart=told_apart,
                               streams=e.pending.get("pending_streams") or [], waited_s=waited),
                  evidence={"active_at_end": e.active_bytes, "allocated_at_end": e.allocated_bytes,
                            "pending_after_synchronize": e.pending_after_sync_bytes,
                            "decided_by": "unfinished-work" if told_apart else "active-at-end", **e.pending},
                  remedy=FINDINGS["pending-stream"])


def _allocator_cache(e: Evidence) -> Judged | None:
    """In a loop (the program marked steps) the cache at exit is what every step reuses:
    activations, and gradients that zero_grad freed after the last step. Only a program
    without steps that ends with a cache is told about it."""
    if e.by != "time" or not e.cache_bytes or e.cache_bytes < SIGNIFICANT_BYTES:
        return None
    reserved, nvml = e.after_empty_cache or (None, None)
    return Judged(
        kind="allocator-cache", bytes=e.cache_bytes,
        summary=tell("allocator-cache", where=e.where, cache_bytes=e.cache_bytes),
        evidence={"reserved_at_end": e.reserved_bytes, "active_at_end": e.active_bytes,
                  "reserved_after_empty_cache": reserved, "nvml_after_empty_cache": nvml},
        remedy=FINDINGS["allocator-cache"])
# -- the edges of the evidence: a disabled collector, an end not seen ----------------------------

COLLECTOR_OFF_SHARE = 0.5  # of the samples that found the collector disabled, for it to count as off


def collector_off(c: dict | None) -> bool:
    """The program ran with automatic collection off: disabled (or a threshold of 0) at exit, or
    disabled at COLLECTOR_OFF_SHARE of the samples or more."""
    if not c:
        return False
    if c.get("enabled_at_exit") is False or c.get("threshold") == 0:
        return True
    samples = c.get("samples") or 0
    return samples > 0 and (c.get("off_samples") or 0) >= COLLECTOR_OFF_SHARE * samples


def _disabled_collector(e: Evidence, garbage: Judged | None) -> Judged:
    """Row 8: growth that only a collection let go of, in a program that runs without automatic
    collection: the cycles are the cause, the disabled collector the reason they piled up."""
    g = e.growth
    size = max(g["grown_bytes"], garbage.bytes if garbage is not None else 0)
    summary = tell("collector-disabled", where=e.where, collector_off=e.collector, growth=g)
    evidence = {"decided_by": "collector-disabled", "cause": "collector-disabled", "collector": e.collector,
                "growth": {k: v for k, v in g.items() if k != "rate_text"},
                "garbage_at_exit_bytes": e.garbage_bytes, "collections_during_run": e.collections}
    return _garbage_cycle(e, size, summary, evidence, FINDINGS["collector-disabled"])


def _end_not_seen(e: Evidence) -> Judged:
    """Row 9: memory was held, and the process ended before anything could say by what."""
    ended = e.ended
    return Judged(
        kind="unknown", bytes=e.last_allocated_bytes,
        summary=tell("end-not-seen", where=e.where, last_allocated_bytes=e.last_allocated_bytes, last_t=e.last_t,
                     ended=ended, short=None if e.enough_samples else shortness(e)),
        evidence={"decided_by": "end-not-seen", "ended": ended, "last_allocated_bytes": e.last_allocated_bytes,
                  "last_t": e.last_t, **samples_of(e)},
        remedy=FINDINGS["end-not-seen"])


def unread(pid: int, device: int | None, nvml_bytes: int, ended: dict) -> Judged:
    """Row 10: a process whose agent saw CUDA start, seen only through NVML because it ended hard
    before the agent's first reading of PyTorch's allocator."""
    return Judged(
        kind="unknown", bytes=nvml_bytes,
        summary=tell("no-reading", pid=pid, device=device, nvml_bytes=nvml_bytes, ended=ended),
        evidence={"decided_by": "no-reading", "ended": ended, "nvml_bytes": nvml_bytes},
        remedy=FINDINGS["no-reading"])


def outside_pytorch(grew: str | None, beyond_allowance: bool, peak: dict | None,
                    allowance: int) -> tuple[str, str] | None:
    """Rows 17, 18 and 11, the first that applies: (what decided it, what the non-torch finding says)
    of the memory outside PyTorch, or None. `grew`: the rate of a lasting growth past warm-up
    (non_torch.judge); `beyond_allowance`: more than the allowance at exit, NCCL's part and other
    libraries' pools left out (non_torch.beyond_allowance); `peak`: the highest level past warm-up
    that a window of readings held (non_torch.run_peak), judged against `allowance` (the allowance,
    NCCL's part and the pools)."""
    if grew is not None:
        decided = "growth"
    elif beyond_allowance:
        decided = "exit"
    elif peak is not None and peak["rise"] > allowance:
        decided = "peak"
    else:
        return None
    return decided, tell("outside-pytorch", decided_by=decided, grew=grew, peak=peak)
