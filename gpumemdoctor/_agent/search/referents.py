"""The labelled references of the objects that hold a program's tensors, one object at a time:
what the garbage look-up (garbage.py) names a cycle's links with. Read without isinstance (which
asks an object for __class__); an autograd node's saved tensors, invisible to gc, are read too.
"""
from __future__ import annotations

import collections
import functools
import gc
import os
import types

from .blocks import TensorKind, tensor_field

ATOMIC = (str, bytes, bytearray, int, float, complex, bool, type(None), types.CodeType,
          types.BuiltinFunctionType, types.ModuleType, memoryview, range)

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
        fn = tensor_field(t, "grad_fn")
    except Exception:
        fn = None
    if fn is not None:
        yield ".grad_fn", fn
    try:
        grad = tensor_field(t, "grad") if tensor_field(t, "is_leaf") else None
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
