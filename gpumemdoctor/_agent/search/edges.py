"""Names for the references along a path that the search found, read without running any of the
program's code (no properties, __getattr__, __repr__, __len__, __iter__ or __eq__ of its classes),
and the path as one line a user recognises, its pattern, and the kind of holder it is."""
from __future__ import annotations

import collections
import functools
import itertools
import operator
import os
import re
import threading
import types

_LRU = type(functools.lru_cache(maxsize=1)(lambda: None))
_GENERATORS = {types.GeneratorType: ("gi_frame", "generator"),
               types.CoroutineType: ("cr_frame", "coroutine"),
               types.AsyncGeneratorType: ("ag_frame", "async generator")}
_ATOMIC_KEYS = (str, int, float, bool, type(None))
# threading.local (the C `_thread._local`): gc reaches each thread's own dict of it through one dict of
# them all, which no attribute names (its __dict__ is the reading thread's own).
_THREAD_LOCAL = type(threading.local())


def key_label(key) -> str:
    if type(key) is str and key.isidentifier():
        return f"[{key!r}]"
    if type(key) in _ATOMIC_KEYS or (type(key) is tuple and all(type(k) in _ATOMIC_KEYS for k in key)):
        text = repr(key)
    else:
        text = f"<{type(key).__name__}>"
    return f"[{text[:40]}]"


def instance_dict(obj):
    """The object's own __dict__, read through the C descriptor only; None when it has none or
    when its class puts something of its own in the way."""
    t = type(obj)
    for cls in t.__mro__:
        d = cls.__dict__.get("__dict__")
        if d is not None:
            if type(d) is not types.GetSetDescriptorType:
                return None
            try:
                value = d.__get__(obj, t)
            except Exception:
                return None
            return value if type(value) is dict else None
    return None


def _slots(obj):
    """(name, value) of the object's slots, read through their member descriptors."""
    t = type(obj)
    for cls in t.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if type(slots) is str else slots:
            d = cls.__dict__.get(name)
            if type(d) is types.MemberDescriptorType:
                try:
                    yield name, d.__get__(obj, t)
                except Exception:
                    continue


def _items(d: dict):
    return dict.items(d)


def _sequence(obj):
    t = type(obj)
    if issubclass(t, list):
        return list.__iter__(obj)
    if issubclass(t, tuple):
        return tuple.__iter__(obj)
    if issubclass(t, collections.deque):
        return collections.deque.__iter__(obj)
    return iter(())


def where(frame) -> str:
    code = frame.f_code
    return f"{code.co_name}() at {os.path.basename(code.co_filename)}:{frame.f_lineno}"


def _local(frame, child):
    try:
        local = frame.f_locals
    except Exception:
        return None
    items = dict.items(local) if type(local) is dict else local.items()
    for k, v in items:
        if v is child:
            return k
    return None


def short_type(t) -> str:
    module = (t.__module__ or "").split(".")[0]
    return f"{module}.{t.__qualname__}" if module and module != "builtins" else t.__qualname__


def labels(chain: list, root: list[str], memo: dict | None = None) -> list[str]:
    """The labels of a path [root object, ..., tensor] after the root's own labels: one per
    reference, with the steps that only plumbing takes (an object's __dict__, a closure's cell)
    folded into the step that names them. `memo` keeps each step's label, keyed by its objects'
    ids, for the next paths of the same search: the paths to a model's parameters share all but
    their last few steps. It holds no reference to the program's objects (a climb would find it)."""
    out = list(root)
    i = 0
    foreign = None
    memo = {} if memo is None else memo
    ids = [*map(id, chain), id(None)]  # the last step's `after` is None
    while i < len(chain) - 1:
        key = (ids[i], ids[i + 1], ids[i + 2])
        named_as = memo.get(key)
        if named_as is None:
            named_as = memo[key] = edge(chain[i], chain[i + 1], chain[i + 2] if i + 2 < len(chain) else None)
        label, used = named_as
        if label is None:  # an object written in C that names nothing: say whose it is, once
            owner = short_type(type(chain[i]))
            package = owner.split(".")[0]
            label = "" if foreign == package else f" ({owner})"
            foreign = package
        else:
            foreign = None
        out.append(label)
        i += used
    return out


def named(parent, child) -> bool:
    """Whether the reference parent -> child is one a user would name the path by: not a dict's
    key (a parameter is its module's before it is a key of its optimizer's state)."""
    if issubclass(type(parent), dict):
        return any(map(operator.is_, dict.values(parent), itertools.repeat(child)))
    return True


def edge(parent, child, after) -> tuple:
    """(label of the reference parent -> child, how many steps it takes: 1, or 2 where it names
    `after` through a plumbing object such as an instance's __dict__). None: no name known. Each
    kind of parent is asked in turn, the first that names the reference (or knows it names nothing)
    answering."""
    t = type(parent)
    if issubclass(t, _THREAD_LOCAL) and type(child) is dict and type(after) is dict:
        return " (a thread's own)", 2  # the threads' dicts, then one thread's: its attributes follow
    return (_container_edge(t, parent, child) or _running_edge(t, parent, child, after)
            or _callable_edge(t, parent, child, after) or _member_edge(t, parent, child, after)
            or _attribute_edge(t, parent, child, after))


def _container_edge(t: type, parent, child):
    """edge() where the parent is a dict (always answered: its key, or the key itself), a list, tuple
    or deque (its index), a set or frozenset; None where another kind of parent may name it."""
    if issubclass(t, dict):
        for k, v in _items(parent):
            if v is child:
                return key_label(k), 1
        for k, v in _items(parent):
            if k is child:
                return "{key}", 1
        return None, 1
    if issubclass(t, (list, tuple, collections.deque)):
        for j, v in enumerate(_sequence(parent)):
            if v is child:
                return f"[{j}]", 1
    if issubclass(t, (set, frozenset)):
        return "{…}", 1
    return None


def _running_edge(t: type, parent, child, after):
    """edge() where the parent is running code: a frame (always answered: a local, its caller), a
    traceback, a suspended generator or coroutine (a local of its frame); else None."""
    if t is types.FrameType:
        name = _local(parent, child)
        if name is not None:
            return f"{where(parent)} local {name}", 1
        if child is parent.f_back:
            return " <- caller", 1
        return None, 1
    if t is types.TracebackType:
        if child is parent.tb_frame:
            return " -> ", 1
        if child is parent.tb_next:
            return ".tb_next", 1
    if t in _GENERATORS:
        attr, what = _GENERATORS[t]
        frame = getattr(parent, attr, None)
        if frame is not None:
            via_frame = child is frame and after is not None
            name = _local(frame, after if via_frame else child)
            if via_frame or name is not None:
                return (f" -> suspended {what} {parent.__qualname__}() at "
                        f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} local {name}"), \
                    2 if via_frame else 1
    return None


def _callable_edge(t: type, parent, child, after):
    """edge() where the parent is a function (a closure's variable, its defaults), a cell, a bound
    method, an lru_cache (always answered) or a functools.partial; else None."""
    if t is types.FunctionType:
        if child is parent.__closure__ and after is not None:
            for name, cell in zip(parent.__code__.co_freevars, parent.__closure__):
                if cell is after:
                    return f" closure {name}", 3
        if child is parent.__defaults__:
            return ".__defaults__", 1
        if child is parent.__kwdefaults__:
            return ".__kwdefaults__", 1
    if t is types.CellType:
        return "", 1
    if t is types.MethodType:
        if child is parent.__self__:
            return ".__self__", 1
        if child is parent.__func__:
            return ".__func__", 1
    if t is _LRU:
        attrs = instance_dict(parent)
        if attrs is not None and child is attrs:
            return _attribute(attrs, after)
        if child is getattr(parent, "__wrapped__", None):
            return ".__wrapped__", 1
        if type(child) is dict and after is not None:  # the cache of an unbounded lru_cache
            return "'s lru_cache", 2
        return "'s lru_cache", 1
    if issubclass(t, functools.partial):
        for name in ("func", "args", "keywords"):
            if child is getattr(parent, name, None):
                return f".{name}", 1
    return None


def _member_edge(t: type, parent, child, after):
    """edge() where the parent is an exception (its traceback, context, cause, args) or a class (an
    attribute of its own __dict__, read raw); else None."""
    if issubclass(t, BaseException):
        for name in ("__traceback__", "__context__", "__cause__", "args"):
            if child is getattr(parent, name, None):
                return f".{name}", 1
    if issubclass(t, type):
        if child is parent.__dict__ or type(child) is dict and after is not None:
            raw = type.__dict__["__dict__"].__get__(parent)
            for k, v in raw.items():
                if v is after:
                    return f".{k}", 2
    return None


def _attribute_edge(t: type, parent, child, after) -> tuple:
    """edge() for any object, last: an attribute in its own __dict__, a slot, its class; always
    answered ((None, 1): no name known)."""
    attrs = instance_dict(parent)
    if attrs is not None:
        if child is attrs and after is not None:
            return _attribute(attrs, after)
        for k, v in _items(attrs):
            if v is child:
                return f".{k}", 1
    for name, value in _slots(parent):
        if value is child:
            return f".{name}", 1
    if child is t:
        return ".__class__", 1
    return None, 1


def _attribute(attrs: dict, value) -> tuple:
    for k, v in _items(attrs):
        if v is value:
            return f".{k}", 2
    return None, 1


# -- the path as text -----------------------------------------------------------------

def render(labels: list[str]) -> str:
    """A path of labels as one readable line: `__main__.errors[3].__traceback__ -> work() local buf`.
    Hops through an autograd graph are counted, not spelled out."""
    if ".next_functions[" not in "".join(labels):  # no graph: the labels as they are
        if len(labels) > 1 and labels[1].startswith("['") and labels[0] and not labels[0].startswith("thread "):
            labels = [labels[0], "." + labels[1][2:-2], *labels[2:]]
        return "".join(labels).replace(" ->  -> ", " -> ")
    return _render_hops(labels)


def _render_hops(labels: list[str]) -> str:
    """render(), label by label: any path, its autograd hops counted."""
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
    group look-alike paths. Everything an autograd graph holds is one pattern: the tensor that
    holds the graph."""
    if ".grad_fn" in text:
        text = text[:text.index(".grad_fn")] + ".grad_fn (autograd graph)"

    def general(m) -> str:
        if m.group().startswith("["):
            return "[*]"
        at = m.start()
        return "" if "at " in text[max(0, at - 60):at] else m.group()  # a line number: ":41" after "at "

    return _GENERAL.sub(general, text)


# An index ([3], [-1], a submodule's ['3']) or a colon and digits (a line number if "at " comes shortly before).
_GENERAL = re.compile(r"\[(?:'-*[0-9]+'|-*[0-9]+)\]|:[0-9]+")


def holder_kind(labels: list[str]) -> str:
    text = "".join(labels)
    if ".grad_fn" in text:
        return "autograd-graph"
    if "__traceback__" in text or ".tb_next" in text:
        return "kept-exception"
    if " -> suspended " in text:
        return "generator"
    if "'s lru_cache" in text:
        return "cache"
    if any(label.startswith(" (") and label.endswith(")") for label in labels):
        return "foreign"
    if "hooks" in text and " closure " in text:
        return "hook"
    if " closure " in text:
        return "closure"
    if labels and labels[0].startswith("thread "):
        return "frame-local"
    if any(label.startswith(".") and not label.startswith(".[") for label in labels[1:]):
        return "attribute"
    return "global"
