"""Out of memory: what would have made it fit. Pure.

From what the agent read at the error (the out-of-memory record: the request, the device's free
memory, PyTorch's free pieces, other processes, what the optimizers that had stepped held and
whether a step was running) and what the search at the error found held (accumulations, graphs),
the parts the program could have freed or avoided, each with its remedy:

- gradients held while the program evaluated, between its steps (grad mode off at the failing
  line, or the steps paused; never inside backward() or an optimizer's step, and not in a step's
  forward, where they may be accumulating over micro-batches);
- autograd graphs that the program's names keep (outputs computed without torch.no_grad());
- free memory inside PyTorch's split segments (fragmentation: an allocator setting frees it);
- an accumulation of alike tensors kept by one holder;
- other processes' memory on the GPU;
- the optimizers' state, likewise between steps (kept for the next step: freeing it costs a reload).

The order is what the fix costs the program: nothing it uses, then a setting, then data it chose to
keep, then other programs, then state it needs again.

A part "would have made it fit" when the request is no more than the device's free memory at the
error plus that part (PyTorch releases its unused cached segments and tries again before it
gives up, so memory freed there would have gone back to the device; what lay free inside its
segments counts only as one piece). The first part in the order above that fits alone is named;
where none does, the largest, and how far it falls short. It is an estimate from figures read at
the error, and the finding says it as one.
"""
from __future__ import annotations

from .remedies import FIT, OUT_OF_MEMORY
from ..units import format_bytes as fb

MIN_PART_BYTES = 64 << 20  # a part smaller than this is not offered as the fix
IN_A_STEP = ("backward", "optimizer step")


def parts(oom: dict, accumulations: list[dict], pid: int) -> list[dict]:
    """The parts the program could have freed at the error, in the order they are offered."""
    out = []
    optimizers = oom.get("optimizers") or []
    outside_step = between_steps(oom)
    grads = sum(row[2] for row in optimizers)
    if grads and outside_step:
        out.append(_part("gradients", grads, "the gradients that the optimizers' parameters still held, no step "
                                             "running"))
    graphs = [a for a in accumulations if a.get("kind") == "autograd-graph"]
    if graphs:
        out.append(_part("graphs", graphs[0]["bytes"], f"the autograd graphs kept through {graphs[0]['pattern']}"))
    split = oom.get("free_in_segments_bytes") or 0
    if split:
        out.append(_part("fragmentation", split, "the free memory in pieces inside PyTorch's segments"))
    kept = [a for a in accumulations if a.get("kind") != "autograd-graph"]
    if kept:
        out.append(_part("kept", kept[0]["bytes"], f"the tensors kept in {kept[0]['pattern']}"))
    others = sum(used or 0 for p, used in oom["processes"] if p != pid)
    if others:
        out.append(_part("other-processes", others, "the memory of the other processes on the GPU"))
    state = sum(row[3] for row in optimizers)
    if state and outside_step:
        out.append(_part("optimizer-state", state, "the optimizers' state, no step running"))
    return [p for p in out if p["bytes"] >= MIN_PART_BYTES]


def between_steps(oom: dict) -> bool:
    """Whether the error came where the gradients and the optimizer state wait for the next step: the
    main thread in no backward() and no optimizer step, and the program evaluating (grad mode off at
    the failing line, or the steps paused). In a step's forward with grad mode on, the gradients may be
    accumulating over micro-batches: they are not offered then."""
    if oom.get("inside") in IN_A_STEP:
        return False
    return oom.get("grad_enabled") is False or oom.get("paused") is True


def _part(name: str, size: int, words: str) -> dict:
    return {"part": name, "bytes": size, "words": words}


def what_fits(oom: dict, accumulations: list[dict], pid: int) -> dict | None:
    """The part that would have made the request fit (or the largest, where none alone would), with
    the free memory it would have left, whether that fits, and its remedy; None where there is no
    such part, or where the request is larger than the process may use at all."""
    request, free = oom["request_bytes"], oom["device_free_bytes"]
    if request > oom["limit_bytes"]:
        return None
    found = parts(oom, accumulations, pid)
    if not found:
        return None
    fitting = [p for p in found if request <= free + p["bytes"]]
    chosen = fitting[0] if fitting else max(found, key=lambda p: p["bytes"])
    return {**chosen, "free_then_bytes": free + chosen["bytes"], "fits": bool(fitting),
            "request_bytes": request, "remedy": FIT.get(chosen["part"]) or OUT_OF_MEMORY[chosen["part"]],
            "parts": [[p["part"], p["bytes"]] for p in found]}


def words(found: dict) -> str:
    """The sentence the out-of-memory finding ends with."""
    part, free, request = f"{found['words']} ({fb(found['bytes'])})", found["free_then_bytes"], found["request_bytes"]
    if found["fits"]:
        return (f" Freeing {part} would have left about {fb(free)} free, enough for the {fb(request)} asked for "
                f"(an estimate from the figures at the error).")
    return (f" The largest part the program could have freed is {part}: alone it would have left about "
            f"{fb(free)} free, {fb(request - free)} short of the {fb(request)} asked for.")
