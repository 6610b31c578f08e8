"""The holder search, inside the target: which objects hold the memory allocated since a baseline.

The holder walk is breadth-first from roots a user recognises: the globals of
the program's own modules, the locals of every live frame of every thread, then
the globals of library modules. Each object is visited once, so the first path
that reaches a tensor is a shortest one. Autograd graphs are followed through
`grad_fn`, `next_functions` and the saved tensors of each node, because the
tensors a graph saves are invisible to `gc`. The walk stops at a time and object
budget and says so.

Called by the growth watch (watch.py), which says when a search runs and guards it.
"""
from __future__ import annotations

import collections
import functools
import gc
import os
import sys
import threading
import time
import types

from .blocks import (PACKAGE_DIR, Spans, TensorKind, cuda_tensors, is_library_file, live_blocks,
                     storage_span, thread_entry, user_frames)

MAX_FRAMES = 8  # of the allocating stack kept per group
MAX_GROUPS = 8
MAX_HOLDERS = 6  # distinct holder patterns per group (without stacks, all is one group)
MAX_SIZES = 3  # most common block sizes kept per holder pattern and for the unheld blocks
ATOMIC = (str, bytes, bytearray, int, float, complex, bool, type(None), types.CodeType,
          types.BuiltinFunctionType, types.ModuleType, memoryview, range)


class Walk:
    """A bounded breadth-first walk from named roots, recording how each object was reached."""

    def __init__(self, kind: TensorKind, spans: Spans, budget_s: float, max_objects: int,
                 skip_ids: set | None = None, user_modules: set | None = None):
        self.kind = kind
        self.user_modules = user_modules or {"__main__"}  # classes of these are walked into
        self.spans = spans
        self.deadline = time.monotonic() + budget_s
        self.max_objects = max_objects
        self.parents: list = []  # node -> (parent node or -1, label)
        self.keep: list = []  # every visited object stays referenced, so no id is reused
        self.seen: set = set(skip_ids or ())
        self.found: dict = {}  # span key -> (node, bytes of the storage)
        self.gave_up: str | None = None
        self.visited = 0

    def run(self, roots) -> None:
        queue: collections.deque = collections.deque()
        for label, obj in roots:
            self._push(queue, obj, -1, label)
        while queue:
            if len(self.found) == len(self.spans):
                return
            if self.visited >= self.max_objects:
                self.gave_up = f"after {self.visited} objects"
                return
            if self.visited % 512 == 0 and time.monotonic() > self.deadline:
                self.gave_up = f"after {self.visited} objects (time budget)"
                return
            obj, node = queue.popleft()
            self.visited += 1
            try:
                for label, child in children(obj, self.kind):
                    self._push(queue, child, node, label)
            except Exception:
                continue

    def _push(self, queue, obj, parent: int, label: str) -> None:
        if issubclass(type(obj), ATOMIC):
            return
        if issubclass(type(obj), type) and getattr(obj, "__module__", None) not in self.user_modules:
            return  # a library's class: its attributes are not where a program keeps tensors
        key = id(obj)
        if key in self.seen:
            return
        self.seen.add(key)
        self.keep.append(obj)
        node = len(self.parents)
        self.parents.append((parent, label))
        if self.kind(obj):
            span = storage_span(obj)
            if span is not None:
                hit = self.spans.find(span[0])
                if hit is not None and hit not in self.found:
                    self.found[hit] = node
        queue.append((obj, node))

    def path(self, node: int) -> list[str]:
        labels = []
        while node != -1:
            parent, label = self.parents[node]
            labels.append(label)
            node = parent
        return labels[::-1]


def children(obj, kind: TensorKind):
    """(label, referent) of an object, for the kinds of objects that hold a program's tensors."""
    # Types are tested on type(obj): isinstance() would ask odd objects for __class__.
    t = type(obj)
    if issubclass(t, dict):
        for k, v in list(obj.items()):
            yield _key_label(k), v
    elif issubclass(t, (list, tuple, collections.deque)):
        for i, v in enumerate(list(obj)):
            yield f"[{i}]", v
    elif issubclass(t, (set, frozenset)):
        for v in list(obj):
            yield "{…}", v
    elif kind(obj):
        yield from _tensor_children(obj)
    elif t is types.FrameType:
        yield from _frame_children(obj)
    elif t is types.TracebackType:
        yield " -> ", obj.tb_frame
        if obj.tb_next is not None:
            yield ".tb_next", obj.tb_next
    elif issubclass(t, BaseException):
        yield ".__traceback__", obj.__traceback__
        yield ".__context__", obj.__context__
        yield ".__cause__", obj.__cause__
        yield ".args", obj.args
        yield from _attributes(obj)
    elif t is types.FunctionType:
        yield from _function_children(obj)
    elif t is types.MethodType:
        yield ".__self__", obj.__self__
        yield ".__func__", obj.__func__
    elif issubclass(t, functools.partial):
        yield ".func", obj.func
        yield ".args", obj.args
        yield ".keywords", obj.keywords
    elif hasattr(t, "next_functions"):
        yield from _autograd_children(obj)
    elif issubclass(t, type):
        for k, v in list(vars(obj).items()):
            if not k.startswith("__"):
                yield f".{k}", v
    elif t is types.CellType:
        try:
            yield "", obj.cell_contents
        except ValueError:
            pass
    else:
        yield from _attributes(obj)


def _key_label(key) -> str:
    if type(key) is str and key.isidentifier():
        return f"[{key!r}]"
    text = repr(key) if type(key) in (str, int, float, tuple, bool) else f"<{type(key).__name__}>"
    return f"[{text[:40]}]"


def _instance_dict(obj):
    """(the object's own __dict__ or None, its attributes as labelled children)."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:
        attrs = None
    if type(attrs) is not dict:
        return None, []
    return attrs, [(f".{k}", v) for k, v in list(attrs.items())]


def _attributes(obj):
    attrs, children = _instance_dict(obj)
    yield from children
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if type(slots) is str else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            try:
                yield f".{slot}", object.__getattribute__(obj, slot)
            except Exception:
                continue
    if attrs is None and not any("__slots__" in cls.__dict__ for cls in type(obj).__mro__[:-1]):
        # A container written in C (deque subclasses, OrderedDict views...): unnamed references.
        for v in gc.get_referents(obj):
            if not issubclass(type(v), type):
                yield ".<ref>", v


def _tensor_children(t):
    try:
        fn = t.grad_fn
    except Exception:
        fn = None
    if fn is not None:
        yield ".grad_fn", fn
    try:
        grad = t.grad if t.is_leaf else None
    except Exception:
        grad = None
    if grad is not None:
        yield ".grad", grad
    yield from _instance_dict(t)[1]


def _autograd_children(node):
    for name in dir(node):
        if name.startswith("_saved_"):
            try:
                value = getattr(node, name)
            except Exception:  # freed by backward(): nothing is held any more
                continue
            yield f".{name}", value
    variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
    if variable is not None:
        yield ".variable", variable
    for i, pair in enumerate(getattr(node, "next_functions", ()) or ()):
        if pair and pair[0] is not None:
            yield f".next_functions[{i}]", pair[0]


def _frame_children(frame):
    code = frame.f_code
    where = f"{code.co_name}() at {os.path.basename(code.co_filename)}:{frame.f_lineno}"
    for k, v in list(frame.f_locals.items()):
        yield f"{where} local {k}", v


def _function_children(fn):
    closure = fn.__closure__ or ()
    for name, cell in zip(fn.__code__.co_freevars, closure):
        try:
            yield f" closure {name}", cell.cell_contents
        except ValueError:
            continue
    if fn.__defaults__:
        yield ".__defaults__", fn.__defaults__
    if fn.__kwdefaults__:
        yield ".__kwdefaults__", fn.__kwdefaults__
    attrs = getattr(fn, "__dict__", None)
    if attrs:
        for k, v in list(attrs.items()):
            yield f".{k}", v


def _is_user_module(name: str, module) -> bool:
    return name == "__main__" or not is_library_file(getattr(module, "__file__", None) or "")


def roots(skip_threads: set) -> list:
    """(label, object) to start from: the program's modules, live frames, then libraries."""
    user, library = [], []
    for name, module in list(sys.modules.items()):
        attrs = getattr(module, "__dict__", None)
        if type(attrs) is not dict or name.startswith("gpumemdoctor"):
            continue
        if _is_user_module(name, module):
            user.append((name, attrs))
        else:
            library.append((name, attrs))
    frames = []
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident in skip_threads:
            continue
        while frame is not None:
            if not frame.f_code.co_filename.startswith(PACKAGE_DIR):
                frames.append((f"thread {names.get(ident, ident)!r}: ", frame))
            frame = frame.f_back
    user.sort(key=lambda r: r[0] != "__main__")
    return user + frames + library


def user_module_names() -> set:
    return {name for name, module in list(sys.modules.items()) if _is_user_module(name, module)}


def render(labels: list[str]) -> str:
    """A path of labels as one readable line: `__main__.errors[3].__traceback__ -> work() local buf`.
    Hops through an autograd graph are counted, not spelled out."""
    text = ""
    hops = 0
    for i, label in enumerate(labels):
        if label.startswith(".next_functions["):
            hops += 1
            continue
        if hops:
            text += f" ({hops} autograd node{'s' if hops != 1 else ''} down)"
            hops = 0
        if i == 1 and label.startswith("[") and labels[0] and not labels[0].startswith("thread "):
            label = "." + label[2:-2] if label.startswith("['") else label  # module global: name.attr
        text += label
    return text.replace(" ->  -> ", " -> ")


def pattern(text: str) -> str:
    """The path with its indexes (also the '3' of a submodule) and line numbers generalised, to
    group look-alike paths.
    Everything an autograd graph holds is one pattern: the tensor that holds the graph."""
    if ".grad_fn" in text:
        text = text[:text.index(".grad_fn")] + ".grad_fn (autograd graph)"
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "[" and i + 1 < len(text) and (text[i + 1].isdigit() or text[i + 1] in "-'"):
            j = text.find("]", i)
            inside = text[i + 1:j] if j > 0 else ""
            if inside.startswith("'") and inside.endswith("'") and len(inside) > 2:
                inside = inside[1:-1]  # a submodule's name in a Sequential or ModuleList: '3'
            if inside.lstrip("-").isdigit():
                out.append("[*]")
                i = j + 1
                continue
        if c == ":" and i + 1 < len(text) and text[i + 1].isdigit() and "at " in text[max(0, i - 60):i]:
            j = i + 1
            while j < len(text) and text[j].isdigit():
                j += 1
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def holder_kind(labels: list[str]) -> str:
    text = "".join(labels)
    if ".grad_fn" in text:
        return "autograd-graph"
    if "__traceback__" in text or ".tb_next" in text:
        return "kept-exception"
    if "hooks" in text and " closure " in text:
        return "hook"
    if " closure " in text:
        return "closure"
    if labels and labels[0].startswith("thread "):
        return "frame-local"
    if any(label.startswith(".") and not label.startswith(".[") for label in labels[1:]):
        return "attribute"
    return "global"


# -- an investigation -------------------------------------------------------------

def investigate(torch, kind: TensorKind, baseline: dict, budget_s: float, max_objects: int,
                skip_threads: set, thread_names: dict, all_live: bool = False) -> dict:
    """Group the live memory allocated since the baseline (with `all_live`, all of the live memory,
    each group marked new or not) by allocating stack, and find who holds it. `baseline` is what
    `take_baseline` returned. The caller holds automatic gc off: the search allocates, and a
    collection it set off would free the program's garbage."""
    started = time.monotonic()
    source = "allocator"
    try:
        live = live_blocks(torch)
    except Exception:
        live = []
    snapshot_s = round(time.monotonic() - started, 3)
    if live or baseline["blocks"]:
        old = baseline["blocks"]
        blocks = [dict(b, new=old.get(b["address"]) != b["size"]) for b in live]
    else:
        # No allocator snapshot here (the cudaMallocAsync backend): tensor storages instead.
        source = "tensors"
        blocks = [dict(b, new=b["address"] not in baseline["storages"]) for b in _tensor_storages(kind)]
    if not all_live:
        blocks = [b for b in blocks if b["new"]]
    spans = Spans((b["address"], b["size"], i) for i, b in enumerate(blocks))
    walk = Walk(kind, spans, budget_s, max_objects, skip_ids={id(baseline), id(blocks), id(live)},
                user_modules=user_module_names())
    walk.run(roots(skip_threads))
    groups: dict = {}
    for i, b in enumerate(blocks):
        frames = b["frames"]
        key = (b["device"], b["new"], tuple(user_frames(frames)[:MAX_FRAMES]))
        g = groups.setdefault(key, {"device": b["device"], "new": b["new"], "bytes": 0, "count": 0,
                                    "frames": [list(f) for f in key[2]], "thread": None,
                                    "holders": {}, "unheld_bytes": 0, "unheld_count": 0,
                                    "unheld_sizes": collections.Counter()})
        g["bytes"] += b["size"]
        g["count"] += 1
        entry = thread_entry(frames)
        if entry is not None:
            g["thread"] = thread_names.get(entry) or [f"a thread running {entry[1]}()"]
        node = walk.found.get(i)
        if node is None:
            g["unheld_bytes"] += b["size"]
            g["unheld_count"] += 1
            g["unheld_sizes"][b["size"]] += 1
            continue
        labels = walk.path(node)
        text = render(labels)
        h = g["holders"].setdefault(pattern(text), {"path": text, "pattern": pattern(text),
                                                    "kind": holder_kind(labels), "count": 0, "bytes": 0,
                                                    "sizes": collections.Counter()})
        h["count"] += 1
        h["bytes"] += b["size"]
        h["sizes"][b["size"]] += 1
    out = []
    for new in (True, False):  # the biggest groups of each: old memory must not crowd out new
        out += sorted((g for g in groups.values() if g["new"] is new), key=lambda g: -g["bytes"])[:MAX_GROUPS]
    for g in out:
        g["holders"] = sorted(g["holders"].values(), key=lambda h: -h["bytes"])[:MAX_HOLDERS]
        # How alike they are: the most common sizes, [size, count].
        for h in g["holders"]:
            h["sizes"] = [[size, n] for size, n in h["sizes"].most_common(MAX_SIZES)]
        g["unheld_sizes"] = [[size, n] for size, n in g["unheld_sizes"].most_common(MAX_SIZES)]
    fresh = [b for b in blocks if b["new"]]
    return {"source": source, "all_live": all_live, "candidate_bytes": sum(b["size"] for b in fresh),
            "candidate_count": len(fresh), "groups": out, "visited": walk.visited,
            "gave_up": walk.gave_up, "elapsed_s": round(time.monotonic() - started, 3),
            "snapshot_s": snapshot_s}


def take_baseline(torch, kind: TensorKind) -> dict:
    """What is alive now, so that an investigation later looks only at what came after."""
    try:
        # address -> size: one dict of ints, which the garbage collector does not track
        blocks = {b["address"]: b["size"] for b in live_blocks(torch)}
    except Exception:
        blocks = {}
    return {"blocks": blocks,
            "storages": {address for _, address, _ in cuda_tensors(kind)} if not blocks else set()}


def _tensor_storages(kind: TensorKind) -> list[dict]:
    seen, out = set(), []
    for tensor, address, size in cuda_tensors(kind):
        if address not in seen:
            seen.add(address)
            out.append({"device": tensor.device.index, "address": address, "size": size, "frames": []})
    return out
