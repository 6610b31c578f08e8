"""A holder search's anchors: one pass over the objects the garbage collector tracks, for every
Python tensor whose memory lies in a block, a tensor's .grad in one, another library's array sharing
one (CuPy's, by `__cuda_array_interface__`), and the tensors whose autograd graphs may save one
(the heads, read later by graphs.py). The rest of the search (search.py) reaches them from the
program's roots. Nothing here runs the program's code: a tensor subclass's __torch_function__ is
held off while its fields are read.
"""
from __future__ import annotations

import gc
import itertools
import sys

from . import blocks, edges
from ...contract import GRAPH_POOL_LABEL
from .blocks import Spans, storage_span, subclasses, tensor_field


def find_anchors(torch, spans: Spans, pools: dict | None = None,
                 graph_types: set | None = None) -> tuple[dict, dict, list, tuple[int, int, int]]:
    """(anchors: id -> object; holders: id -> [(block key, suffix labels)]; heads: [(tensor, labels
    up to its graph, the graph's first node)]; the objects in the heap, the tensors among them, and
    the tensors whose .grad carries an autograd graph). `pools`: a private pool's id -> the keys of its
    segments' blocks; the CUDA graph (of `graph_types`) whose pool it is holds them, and a tensor in
    them (a static output) is their holder only where no graph is found."""
    tensor_types = subclasses(torch.Tensor)
    array_types = foreign_array_types()
    graph_types = (graph_types if graph_types is not None else blocks.graph_types(torch)) if pools else set()
    wanted = tensor_types | array_types | graph_types
    objs = gc.get_objects()
    heap_objects = len(objs)
    found = list(itertools.compress(objs, map(wanted.__contains__, map(type, objs))))
    del objs
    tensors = [o for o in found if type(o) in tensor_types]
    arrays = [o for o in found if type(o) in array_types] if array_types else []
    graphs = [o for o in found if type(o) in graph_types] if graph_types else []
    del found
    tensor_count = len(tensors)
    graph_grads = 0  # tensors whose .grad carries an autograd graph (create_graph=True)
    anchors: dict = {}
    holders: dict = {}

    def add(obj, key, suffix):
        anchors[id(obj)] = obj
        holders.setdefault(id(obj), []).append((key, suffix))

    def locate(tensor):
        span = storage_span(tensor)
        return spans.find(span[0]) if span is not None else None

    by_graph: set = set()  # the block keys a CUDA graph holds (its pool's segments)
    for g in graphs:
        for key in (pools or {}).get(blocks.graph_pool(torch, g), ()):
            add(g, key, [GRAPH_POOL_LABEL])
            by_graph.add(key)
    del graphs
    field = tensor_field
    heads = []  # (tensor, labels up to its graph, the graph's first node)
    # A tensor subclass's __torch_function__ is the program's code: not run while reading.
    guard = getattr(getattr(torch, "_C", None), "DisableTorchFunctionSubclass", None)
    with guard() if guard is not None else _Nothing():
        for t in tensors:
            key = locate(t)
            if key is not None and key not in by_graph:
                add(t, key, [])
            try:
                if not field(t, "requires_grad"):
                    continue
                fn = field(t, "grad_fn")
                g = field(t, "grad") if fn is None else None
                grad_fn = field(g, "grad_fn") if g is not None else None
            except Exception:
                continue
            if fn is not None:
                heads.append((t, [".grad_fn"], fn))
            elif g is not None:
                key = locate(g)
                if key is not None:
                    add(t, key, [".grad"])
                if grad_fn is not None:  # backward(create_graph=True): the gradient keeps a graph
                    heads.append((t, [".grad", ".grad_fn"], grad_fn))
                    graph_grads += 1
        for a in arrays:
            found_in = array_block(a, spans)
            if found_in is not None:
                add(a, *found_in)
    del tensors, arrays
    return anchors, holders, heads, (heap_objects, tensor_count, graph_grads)


def foreign_array_types() -> set:
    """Another GPU library's array types whose memory may lie in PyTorch's blocks (CuPy's), where
    that library is imported."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(getattr(cupy, "ndarray", None)) is type:
        return subclasses(cupy.ndarray)
    return set()


def array_block(a, spans: Spans) -> tuple | None:
    """(block key, suffix labels) of an array of another library that shares a block's memory (by
    __cuda_array_interface__), or None."""
    try:
        pointer = a.__cuda_array_interface__["data"][0]
    except Exception:
        return None
    key = spans.find(pointer)
    return None if key is None else (key, [f" ({edges.short_type(type(a))} sharing its memory)"])


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
