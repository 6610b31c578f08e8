"""An out-of-memory error's finding (judgement row 5): its cause, with the claim that names it, what
would have made it fit (fit.py), and where the failing step was asked for more than any before it.
Every figure is held to the limit in force (limits.py). Pure."""
from __future__ import annotations

from . import claims, fit
from .claims import Claim
from .evidence import Evidence, Judged, line_of, oom_brief
from .remedies import OUT_OF_MEMORY
from .summaries import tell

OOM_ACCUMULATION_SHARE = 0.5  # of the allocated memory at the error, held by one accumulation
OTHER_PROCESSES_SHARE = 0.25  # of the device, held by other processes, to blame them
OOM_CAUSES = ("accumulation", "request-too-large", "fragmentation", "other-processes", "full")


def cause(e: Evidence, oom: dict) -> str:
    """The first that applies: the request cannot fit at all; the allocator's free pieces would
    have served it had they been one piece (the pieces alone add up to the request, none is as
    large), unless the running step had needed more beyond the earlier steps' peak than the pieces
    hold (one long batch under a cap: as one piece they serve this request, and the step goes on
    growing past them: the step, not the split, used up the limit); an accumulation filled the
    memory; other processes hold it (and the limit in force had room for it); the program's own
    memory is simply too much."""
    return cause_and_claim(e, oom)[0]


def cause_and_claim(e: Evidence, oom: dict) -> tuple[str, Claim | None]:
    """The cause (OOM_CAUSES) and the claim that names it with its evidence."""
    request, limit = oom["request_bytes"], oom["limit_bytes"]
    source = e.limit_source
    if request > limit:
        return "request-too-large", claims.make("request-too-large", request_bytes=request, limit_bytes=limit,
                                                limit_source=source)
    room = fit.headroom(oom)
    fragmented = claims.make("fragmented", request_bytes=request, free_in_segments_bytes=oom["free_in_segments_bytes"],
                             largest_free_block_bytes=oom["largest_free_block_bytes"], headroom_bytes=room,
                             limit_bytes=limit, limit_source=source, step_excess_bytes=step_excess(e, oom))
    if fragmented is not None:
        return "fragmentation", fragmented
    allocated = oom["allocated_bytes"] or 0
    held = kept_at_error(e, oom)
    if held and held[0]["bytes"] >= OOM_ACCUMULATION_SHARE * allocated > 0:
        a = held[0]
        return "accumulation", claims.make("accumulation-filled", pattern=a["pattern"], bytes=a["bytes"],
                                           allocated_bytes=allocated, share=OOM_ACCUMULATION_SHARE)
    if e.growth and e.growth["grown_bytes"] >= OOM_ACCUMULATION_SHARE * allocated > 0:
        # the memory the run was seen to pile up filled the GPU
        return "accumulation", claims.make("accumulation-filled", pattern="the growth seen over the run",
                                           bytes=e.growth["grown_bytes"], allocated_bytes=allocated,
                                           share=OOM_ACCUMULATION_SHARE)
    others = sum(used or 0 for pid, used in oom["processes"] if pid != e.pid)
    under_limit = limit - (oom["reserved_bytes"] or 0) >= request  # the limit in force had room for it
    if others >= OTHER_PROCESSES_SHARE * limit and request <= others + oom["device_free_bytes"] and under_limit:
        return "other-processes", claims.make("other-processes", others_bytes=others, limit_bytes=limit,
                                              share=OTHER_PROCESSES_SHARE)
    return "full", claims.make("own-memory-full", allocated_bytes=oom["allocated_bytes"], request_bytes=request,
                               headroom_bytes=room, limit_bytes=limit, limit_source=source)


def kept_at_error(e: Evidence, oom: dict) -> list[dict]:
    """The accumulations the search at the error found, less the running step's own: alike tensors
    held by locals of the functions inside the outermost module call with grad mode on (a model's
    `hidden_states`, one a layer) are the activations the step is made of, not memory kept."""
    return [a for a in e.oom_accumulations if not fit.running_step(oom, a)]


def finding(e: Evidence, oom: dict, cause: str) -> Judged:
    request, limit = oom["request_bytes"], oom["limit_bytes"]
    allocated, reserved = oom["allocated_bytes"], oom["reserved_bytes"]
    unallocated = None if allocated is None or reserved is None else reserved - allocated
    others = [[pid, used] for pid, used in oom["processes"] if pid != e.pid]
    figures = tell("oom-figures", request_bytes=request, device_free_bytes=oom["device_free_bytes"],
                   headroom_bytes=fit.headroom(oom), limit_bytes=limit, limit_source=e.limit_source,
                   allocated_bytes=allocated, unallocated_bytes=unallocated,
                   largest_free_block_bytes=oom["largest_free_block_bytes"], others=[u for _, u in others])
    if e.uncaught is not None and "OutOfMemoryError" in e.uncaught["exc_type"]:
        ended = "uncaught"
    elif e.exited_normally and e.uncaught is None:
        ended = "caught"
    else:
        ended = None
    cause_claim = cause_and_claim(e, oom)[1]
    said = [cause_claim] if cause_claim is not None else []
    suspects = e.oom_suspects if cause in ("full", "accumulation") else []
    larger = _larger_step(e, oom) if cause == "full" else []
    grown = next((c for c in larger if c.name == "larger-step"), None)
    excess = step_excess(e, oom) if grown is not None else None
    # What would have made it fit: for a step asked for more than any before it, only a part at least as
    # large as what it needed beyond them (a smaller one makes room for this request, not for the step).
    fits = fit.what_fits(oom, e.oom_accumulations, e.pid, e.limit_source, min_part_bytes=excess or 0)
    fit_claim = fits.pop("claim") if fits else None
    said += [fit_claim] if fit_claim is not None else []
    if excess is not None:
        larger.append(claims.make("split-not-the-cause", request_bytes=request,
                                  free_in_segments_bytes=oom["free_in_segments_bytes"],
                                  largest_free_block_bytes=oom["largest_free_block_bytes"], step_excess_bytes=excess))
        larger = [c for c in larger if c is not None]
        if (oom["free_in_segments_bytes"] or 0) < request:  # (the pieces could not have served it anyway)
            larger = [c for c in larger if c.name != "split-not-the-cause"]
    said += larger
    if fits and fits["fits"] and cause == "full":
        remedy = fits["remedy"]
    elif grown is not None:
        remedy = larger_step_remedy(oom, grown, next((c for c in larger if c.name == "inputs-at-error"), None))
    else:
        remedy = OUT_OF_MEMORY[cause]
    return Judged(
        kind="out-of-memory", bytes=request,
        summary=tell("out-of-memory", where=e.where, line=line_of(oom["stack"]), thread=oom["thread"],
                     cause=cause_claim, ended=ended, said=larger + ([fit_claim] if fit_claim is not None else [])),
        evidence={"decided_by": "out-of-memory", "cause": cause, "figures": figures, "errors": len(e.ooms),
                  "first": oom_brief(oom), "root_cause": e.oom_search, "what_would_fit": fits,
                  "limit_bytes": limit, "limit_source": e.limit_source},
        remedy=remedy, suspects=suspects, claims=said)


def step_excess(e: Evidence, oom: dict) -> int | None:
    """What the step running at the error needed (its allocated memory then and the request) beyond
    the earlier steps' allocated peak; None where no step was running, none came before it, or it
    needed no more than they did."""
    if fit.between_steps(oom) or not oom.get("step") or e.peak_before_error is None:
        return None
    need = (oom["allocated_bytes"] or 0) + oom["request_bytes"]
    return need - e.peak_before_error if need > e.peak_before_error else None


def larger_step_remedy(oom: dict, grown: Claim, inputs: Claim | None) -> str:
    """The remedies of a step asked for more than any before it, in order, each with what it would
    save as the figures at the error say: the earlier steps' peak at their inputs; the step's own
    tensors (allocated less the optimizers' parameters, gradients and state) that checkpointing and
    bf16 autocast shrink."""
    given = (inputs.evidence.get("earlier_inputs") or []) if inputs is not None and inputs.name == "inputs-at-error" else []
    held = sum(row[1] + row[2] + row[3] for row in oom.get("optimizers") or [])
    own = (oom["allocated_bytes"] or 0) - held
    return tell("oom-larger-step-remedy", earlier_peak_bytes=grown.evidence["earlier_peak_bytes"],
                earlier_inputs=[(name, shape) for name, shape, _, _ in given],
                own_bytes=own if oom.get("optimizers") and own > 0 else None)


def _larger_step(e: Evidence, oom: dict) -> list[Claim]:
    """Where the failing step was asked for more than any step before it: its allocated memory at the
    error and the request, against the earlier steps' allocated peak (PyTorch's counter at the last
    step's sample before it), and the inputs of the outermost module call at the error. What the
    steps before were given is not recorded: that is said, not guessed."""
    out: list[Claim] = []
    if fit.between_steps(oom):  # an evaluation between the steps: no step was running
        return out
    before = e.peak_before_error
    need = (oom["allocated_bytes"] or 0) + oom["request_bytes"]
    larger = claims.make("larger-step", step=oom.get("step"), needed_bytes=need, earlier_peak_bytes=before,
                         steps_before=oom.get("step"))
    if larger is None:
        return out
    out.append(larger)
    inputs = oom.get("inputs")
    if inputs:
        out.append(claims.make("inputs-at-error", inputs=inputs, earlier_inputs=oom.get("earlier_inputs")))
    else:
        out.append(claims.not_seen("the failing step's input", "no module's forward was running at the error"
                                   if inputs is not None else "this recording does not have it (made before the "
                                   "agent read a step's input at the error)"))
    return [c for c in out if c is not None]
