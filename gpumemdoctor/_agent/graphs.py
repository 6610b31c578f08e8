"""Autograd graphs: which allocator blocks a graph keeps through its saved tensors, named from the
tensor that holds the graph. The saved tensors are invisible to the garbage collector, so they are
read from each node (`_saved_*`, a custom Function's saved_tensors); the names of a node type's
saved fields are looked up once per type, and a node whose saved tensors were freed by backward()
is not descended from."""
from __future__ import annotations


MAX_NODES = 2_000_000
MAX_HEADS = 4  # tensors whose graphs save one block, kept to choose from


class SavedNames:
    """Node type -> names of its saved fields (dir() of the type, once per type)."""

    def __init__(self):
        self._names: dict = {}

    def __call__(self, node_type) -> tuple:
        names = self._names.get(node_type)
        if names is None:
            try:
                names = tuple(n for n in dir(node_type) if n.startswith("_saved_"))
                if "saved_tensors" in dir(node_type):
                    names += ("saved_tensors",)
            except Exception:
                names = ()
            self._names[node_type] = names
        return names


def graph_holders(heads: list, locate, placed_already: dict, wanted: int, budget,
                  kind) -> tuple[dict, int, str | None]:
    """For each (head tensor, its labels up to .grad_fn, the graph's first node) in `heads`, walk
    its graph and find the blocks its saved tensors lie in: `locate(tensor)` -> block key or None.
    Returns ({block key: [(head, labels), ...]}, nodes read, why it stopped early or None) for the
    blocks not in `placed_already`, with up to MAX_HEADS heads per block (graphs share nodes: the
    caller keeps the head it can reach). A walk stops where backward() has freed the saved
    tensors; all walks stop once every one of `wanted` blocks has MAX_HEADS heads."""
    names = SavedNames()
    placed: dict = {}
    keep: list = []  # nodes stay referenced so that their ids are not reused
    visited = 0
    full = 0
    for head, head_labels, root in heads:
        seen: set = set()
        stack = [(root, 0)]
        while stack:
            node, hops = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            keep.append(node)
            visited += 1
            if visited % 256 == 0 and (budget.over() or visited >= MAX_NODES):
                return placed, visited, "time" if budget.over() else "nodes"
            freed, full = _read_saved(node, names(type(node)), locate, placed, placed_already, head, head_labels,
                                      hops, kind, full)
            if freed:
                continue  # backward() has run through it: nothing below it is saved any more
            try:
                nexts = node.next_functions
            except Exception:
                continue
            for pair in nexts or ():
                child = pair[0] if pair else None
                if child is not None and id(child) not in seen:
                    stack.append((child, hops + 1))
            if full >= wanted:
                return placed, visited, None
    return placed, visited, None


def _read_saved(node, saved: tuple, locate, placed: dict, placed_already: dict, head, head_labels, hops,
                kind, full: int) -> tuple[bool, int]:
    """Place the blocks of the node's saved tensors. (True when every saved field raised, freed by
    backward; how many blocks have all the heads they can have)."""
    raised = 0
    for name in saved:
        try:
            value = getattr(node, name)
        except Exception:
            raised += 1
            continue
        values = value if type(value) in (tuple, list) else (value,)
        for v in values:
            if not kind(v):
                continue
            key = locate(v)
            if key is None or key in placed_already:
                continue
            found = placed.setdefault(key, [])
            if len(found) < MAX_HEADS and all(h is not head for h, _ in found):
                found.append((head, [*head_labels, *[".next_functions[0]"] * hops, f".{name}"]))
                if len(found) == MAX_HEADS:
                    full += 1
    return bool(saved) and raised == len(saved), full
