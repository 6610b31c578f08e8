"""What gc.collect() frees at exit, looked at first: the types in the cycles and the CUDA tensors in them.

Runs inside the target, from the exit probes (exit.py), which guard it.
"""
from __future__ import annotations

import collections
import gc

from .search.blocks import Spans, TensorKind, storage_span, tensor_field, user_frames
from .search.edges import pattern
from .search.referents import ATOMIC, children
from .search.search import MAX_FRAMES, MAX_GROUPS


def collect_garbage(kind: TensorKind, frames_of: Spans | None, cuda_only: bool = True) -> dict:
    """gc.collect(), but look at what it frees first: the types in the cycles and the CUDA
    tensors among them, with the object in the cycle that holds each."""
    before = len(gc.garbage)
    old = gc.get_debug()
    gc.set_debug(old | gc.DEBUG_SAVEALL)
    try:
        collected = gc.collect()
    finally:
        gc.set_debug(old)
    found = gc.garbage[before:]
    del gc.garbage[before:]
    try:
        report = _describe_garbage(found, kind, frames_of, cuda_only)
    finally:
        del found
    # Free them for real, when they hold tensors: the next probes must see that memory back.
    # Other garbage is left to the interpreter's own collection at shutdown (a full collection
    # of a heap with torch loaded takes 0.1-0.2 s).
    report["collected"] = collected + (gc.collect() if report["cuda_tensors"] else 0)
    return report


def _describe_garbage(found: list, kind: TensorKind, frames_of: Spans | None,
                      cuda_only: bool = True) -> dict:
    # Most exits free only plumbing (tens of thousands of objects from imports and closures):
    # looking inside each of them took 0.6 s at the end of an AdamW loop on an H100, so the
    # garbage is first checked for tensors at all, which costs a type look-up per object.
    if not any(kind(o) and (not cuda_only or _is_cuda(o)) for o in found):
        return {"objects": len(found), "types": [], "cuda_tensor_bytes": 0, "cuda_tensors": 0, "tensors": []}
    in_garbage = {id(o) for o in found}
    storages: dict = {}
    owners: list = []
    for obj in found:
        if issubclass(type(obj), ATOMIC) or kind(obj):
            continue
        for label, child in _inside(obj, kind, in_garbage):
            if not kind(child):
                continue
            try:
                if cuda_only and not tensor_field(child, "is_cuda"):
                    continue
            except Exception:
                continue
            span = storage_span(child)
            if span is None or span[0] in storages:
                continue
            owners.append(obj)
            owner = _owner_name(obj, found)
            storages[span[0]] = {"bytes": span[1], "holder": f"{owner}{label}",
                                 "cycle": pattern(_cycle(obj, found, in_garbage, kind)),
                                 "frames": [list(f) for f in user_frames(frames_of.find(span[0]) or [])
                                            [:MAX_FRAMES]] if frames_of else []}
    tensors = sorted(storages.values(), key=lambda s: -s["bytes"])
    # The types of the cycles that hold the tensors; a collection at exit also frees much else.
    in_cycles = _component(owners, in_garbage, kind) if owners else found
    types_seen = collections.Counter(type(o).__qualname__ for o in in_cycles)
    user_types = [(n, c) for n, c in types_seen.most_common() if n not in _PLUMBING]
    return {"objects": len(found), "types": [[n, c] for n, c in (user_types or types_seen.most_common())[:8]],
            "cuda_tensor_bytes": sum(s["bytes"] for s in tensors), "cuda_tensors": len(tensors),
            "tensors": _merge_garbage(tensors)}


def _is_cuda(tensor) -> bool:
    try:
        return bool(tensor_field(tensor, "is_cuda"))
    except Exception:
        return False


_PLUMBING = {"dict", "list", "tuple", "cell", "function", "method", "frame", "set", "Tensor", "Parameter"}


def _inside(obj, kind: TensorKind, in_garbage: set) -> list:
    """The labelled referents of `obj` that are garbage too."""
    try:
        return [(label, child) for label, child in children(obj, kind) if id(child) in in_garbage]
    except Exception:
        return []


def _component(starts: list, in_garbage: set, kind: TensorKind, limit: int = 20_000) -> list:
    """The garbage reachable from `starts` through garbage only (at most `limit` objects)."""
    seen = {id(o) for o in starts}
    out = list(starts)
    queue = collections.deque(starts)
    while queue and len(out) < limit:
        for _, child in _inside(queue.popleft(), kind, in_garbage):
            if id(child) not in seen:
                seen.add(id(child))
                out.append(child)
                queue.append(child)
    return out


def _owner_name(obj, found) -> str:
    if type(obj) is dict:
        for other in found:  # the object whose __dict__ this is
            try:
                if object.__getattribute__(other, "__dict__") is obj:
                    return type(other).__qualname__
            except Exception:
                continue
        return "dict"
    return type(obj).__qualname__


def _cycle(start, found, in_garbage: set, kind: TensorKind, limit: int = 6) -> str:
    """A short loop of references through `start` inside the garbage, as types and labels."""
    queue = collections.deque([(start, [])])
    seen = {id(start)}
    while queue:
        obj, path = queue.popleft()
        if len(path) >= limit:
            continue
        for label, child in _inside(obj, kind, in_garbage):
            step = path + [(obj, label)]
            if child is start:
                return " -> ".join(f"{_short_type(o)}{'' if type(o) is dict else l}"
                                   for o, l in step) + f" -> {_short_type(start)}"
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((child, step))
    return ""


def _short_type(obj) -> str:
    return type(obj).__qualname__


def _merge_garbage(tensors: list[dict]) -> list[dict]:
    merged: dict = {}
    for t in tensors:
        key = (t["holder"], t["cycle"], tuple(map(tuple, t["frames"])))
        m = merged.setdefault(key, {"holder": t["holder"], "cycle": t["cycle"], "frames": t["frames"],
                                    "bytes": 0, "count": 0})
        m["bytes"] += t["bytes"]
        m["count"] += 1
    return sorted(merged.values(), key=lambda m: -m["bytes"])[:MAX_GROUPS]
