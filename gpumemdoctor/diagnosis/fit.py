"""Out of memory: what would have made it fit. Pure.

From what the agent read at the error (the out-of-memory record: the request, the device's free
memory, the limit in force, PyTorch's free pieces, other processes, what the optimizers that had
stepped held and whether a step was running) and what the search at the error found held
(accumulations, graphs), the parts the program could have freed or avoided, each with its remedy:

- gradients held while the program evaluated, between its steps (grad mode off at the failing
  line, or the steps paused; never inside backward() or an optimizer's step, and not in a step's
  forward, where they may be accumulating over micro-batches);
- autograd graphs that the program's names keep after their step (outputs computed without
  torch.no_grad()); never the running computation's own: graphs held by a local of a function on
  the error's stack with grad mode on, or anything while backward() runs, are the activations the
  step is made of (`running_step`);
- free memory inside PyTorch's split segments (fragmentation: an allocator setting frees it);
- an accumulation of alike tensors kept by one holder;
- other processes' memory on the GPU;
- the optimizers' state, likewise between steps (kept for the next step: freeing it costs a reload).

The order is what the fix costs the program: nothing it uses, then a setting, then data it chose to
keep, then other programs, then state it needs again.

The headroom at the error is what a new segment could still have had: the device's free memory, and
no more than the limit in force less what PyTorch had reserved (a per-process memory fraction). A part
"would have made it fit" when the request is no more than the headroom plus that part (PyTorch releases
its unused cached segments and tries again before it gives up, so memory freed there would have gone
back; what lay free inside its segments counts only as one piece); other processes' memory adds to the
device's free memory only, never past the limit. What it would have left is never above the limit in
force. The first part in the order above that fits alone is named; where none does, the largest, and
how far it falls short. It is an estimate from figures read at the error, and the finding says it as one.
"""
from __future__ import annotations

import os
import re

from . import claims
from .claims import Claim
from .remedies import FIT, OUT_OF_MEMORY

MIN_PART_BYTES = 64 << 20  # a part smaller than this is not offered as the fix
IN_A_STEP = ("backward", "optimizer step")
MODULE_FILE = "/".join(("torch", "nn", "modules", "module.py"))  # nn.Module._call_impl's file, in a stack
_LOCAL = re.compile(r"^thread '[^']*': (?P<fn>[^\s(]+)\(\) at (?P<file>\S+) local ")


def headroom(oom: dict) -> int:
    """What a new segment could still have had at the error: the device's free memory (other processes'
    use taken out), and under the limit in force no more than it less PyTorch's reserved memory."""
    free = oom["device_free_bytes"]
    reserved = oom.get("reserved_bytes")
    if reserved is not None:
        free = min(free, max(0, oom["limit_bytes"] - reserved))
    return max(0, free)


def running_step(oom: dict, holder: dict) -> bool:
    """Whether an autograd graph's holder is the running computation's own activations: backward() was
    running, or grad mode was on and the holder is a local of a function running inside the outermost
    module call on the error's stack (a model's forward: `hidden_states`); not a local of the program's
    own function that called it (an evaluation's list of outputs keeps graphs after each batch)."""
    if oom.get("inside") == "backward":
        return True
    if not oom.get("grad_enabled", True):
        return False
    found = _LOCAL.match(holder.get("path") or holder.get("pattern") or "")
    if found is None:
        return False
    stack = oom.get("stack") or []  # innermost first
    calls = [i for i, (file, _, fn) in enumerate(stack) if fn == "_call_impl" and file.endswith(MODULE_FILE)]
    if not calls:
        return False
    inside = {(fn, os.path.basename(file)) for file, _, fn in stack[:calls[-1]]}
    return (found["fn"], os.path.basename(found["file"].split(":")[0])) in inside


def parts(oom: dict, accumulations: list[dict], pid: int) -> list[dict]:
    """The parts the program could have freed at the error, in the order they are offered."""
    out = []
    optimizers = oom.get("optimizers") or []
    outside_step = between_steps(oom)
    grads = sum(row[2] for row in optimizers)
    if grads and outside_step:
        out.append(_part("gradients", grads))
    graphs = [a for a in accumulations if a.get("kind") == "autograd-graph" and not running_step(oom, a)]
    if graphs:
        out.append(_part("graphs", graphs[0]["bytes"], graphs[0]["pattern"]))
    split = oom.get("free_in_segments_bytes") or 0
    if split:
        out.append(_part("fragmentation", split))
    kept = [a for a in accumulations if a.get("kind") != "autograd-graph" and not running_step(oom, a)]
    if kept:
        out.append(_part("kept", kept[0]["bytes"], kept[0]["pattern"]))
    others = sum(used or 0 for p, used in oom["processes"] if p != pid)
    if others:
        out.append(_part("other-processes", others))
    state = sum(row[3] for row in optimizers)
    if state and outside_step:
        out.append(_part("optimizer-state", state))
    return [p for p in out if p["bytes"] >= MIN_PART_BYTES]


def between_steps(oom: dict) -> bool:
    """Whether the error came where the gradients and the optimizer state wait for the next step: the
    main thread in no backward() and no optimizer step, and the program evaluating (grad mode off at
    the failing line, or the steps paused). In a step's forward with grad mode on, the gradients may be
    accumulating over micro-batches: they are not offered then."""
    if oom.get("inside") in IN_A_STEP:
        return False
    return oom.get("grad_enabled") is False or oom.get("paused") is True


def _part(name: str, size: int, holder: str | None = None) -> dict:
    return {"part": name, "bytes": size, "holder": holder}


def free_then(oom: dict, part: dict) -> int:
    """What the headroom would have been had the part been freed: within the limit in force."""
    room = headroom(oom)
    if part["part"] == "other-processes":  # the device's free memory grows; the limit does not
        reserved = oom.get("reserved_bytes") or 0
        return min(oom["device_free_bytes"] + part["bytes"], max(0, oom["limit_bytes"] - reserved))
    return min(room + part["bytes"], oom["limit_bytes"])


def what_fits(oom: dict, accumulations: list[dict], pid: int, limit_source: str | None = None,
              min_part_bytes: int = 0) -> dict | None:
    """The part that would have made the request fit (or the largest, where none alone would), with
    the free memory it would have left, whether that fits, its remedy and its claim (`claim`, a
    claims.Claim); None where there is no such part, or where the request is larger than the
    process may use at all. Parts below `min_part_bytes` are not offered (what a step asked for more
    than any before it needed beyond them: a smaller part makes room for the request, not the step)."""
    request = oom["request_bytes"]
    if request > oom["limit_bytes"]:
        return None
    found = [p for p in parts(oom, accumulations, pid) if p["bytes"] >= min_part_bytes]
    if not found:
        return None
    fitting = [p for p in found if request <= free_then(oom, p)]
    chosen = fitting[0] if fitting else max(found, key=lambda p: p["bytes"])
    left = free_then(oom, chosen)
    room = headroom(oom)
    evidence = {"part": chosen["part"], "part_bytes": chosen["bytes"], "holder": chosen["holder"],
                "request_bytes": request, "headroom_bytes": room,
                # (other processes' memory frees device memory only: within the limit, the part's bytes)
                "free_then_bytes": left, "limit_bytes": oom["limit_bytes"], "limit_source": limit_source}
    if chosen["part"] == "other-processes":
        evidence["part_bytes"] = left - room
    claim = claims.make("would-have-fit" if fitting else "would-fall-short", **evidence)
    return {"part": chosen["part"], "bytes": chosen["bytes"], "holder": chosen["holder"], "free_then_bytes": left,
            "headroom_bytes": room, "fits": bool(fitting), "request_bytes": request,
            "remedy": FIT.get(chosen["part"]) or OUT_OF_MEMORY[chosen["part"]],
            "parts": [[p["part"], p["bytes"]] for p in found], "claim": claim}


def words(found: dict) -> str:
    """The sentence the out-of-memory finding ends with: its would-fit claim's (words.py), or ''."""
    from .words import sentence, say

    claim: Claim | None = found.get("claim")
    return f" {sentence(say(claim))}" if claim is not None else ""
