"""Autograd graphs: which allocator blocks a graph keeps through its saved tensors, named from the
tensor that holds the graph. The saved tensors are invisible to the garbage collector, so they are
read from each node (its `_saved_*` tensor fields, those with a `_raw_saved_*` twin; a custom
Function's saved_tensors); the names of a node type's fields are looked up once per type, and its
other saved fields (sizes, flags) are not read. A node whose saved tensors backward() has freed
(reading one raises, and none gives a tensor) is not descended from: backward() ran through
everything below it that it needed, so a graph kept after its backward costs a node or two, not a
walk of the whole graph (47,616 nodes and 0.46 s at the exit of corpus/hf_gpt2_kept_outputs.py on
an H100, when only a node all of whose saved fields raised counted as freed, and sizes never do).
A saved weight that the optimizer has since changed in place raises too: the node's other tensors
are still there, and the walk goes on below it."""
from __future__ import annotations


MAX_NODES = 2_000_000
MAX_HEADS = 4  # tensors whose graphs save one block, kept to choose from


class SavedNames(dict):
    """Node type -> names of its saved tensor fields (dir() of the type, once per type)."""

    def __missing__(self, node_type) -> tuple:
        try:
            every = dir(node_type)
            names = tuple(n for n in every if n.startswith("_saved_"))
            if any(n.startswith("_raw_saved_") for n in every):  # the tensor fields only
                names = tuple(n for n in names if f"_raw{n}" in every)
            if "saved_tensors" in every:
                names += ("saved_tensors",)
        except Exception:
            names = ()
        self[node_type] = names
        return names


def graph_holders(heads: list, locate, placed_already: dict, wanted: int, budget, kind,
                  reached: frozenset | set = frozenset()) -> tuple[dict, int, str | None]:
    """For each (head tensor, its labels up to .grad_fn, the graph's first node) in `heads`, walk
    its graph and find the blocks its saved tensors lie in: `locate(tensor)` -> block key or None.
    Returns ({block key: [(head, labels), ...]}, nodes read, why it stopped early or None) for the
    blocks not in `placed_already`, with up to MAX_HEADS heads per block (graphs share nodes: the
    caller keeps the head it can reach). `reached` holds the ids of the heads the caller can
    reach, which come first in `heads`: a block with one of them needs no other head, and a node
    read from one is not read again from a later head. All walks stop once every one of `wanted`
    blocks is settled that way."""
    names = SavedNames()
    placed: dict = {}
    settled: set = set()  # blocks with a reached head or MAX_HEADS heads
    keep: list = []  # nodes stay referenced so that their ids are not reused
    shared: set = set()  # ids of the nodes read from a reached head
    visited = 0
    for head, head_labels, root in heads:
        from_reached = id(head) in reached
        seen = shared if from_reached else set()
        stack = [(root, 0)]
        while stack:
            node, hops = stack.pop()
            node_id = id(node)
            if node_id in seen or node_id in shared:
                continue
            seen.add(node_id)
            keep.append(node)
            visited += 1
            if visited % 256 == 0 and (budget.over() or visited >= MAX_NODES):
                return placed, visited, "time" if budget.over() else "nodes"
            saved = names[type(node)]
            if saved and _read_saved(node, saved, locate, placed, placed_already, settled, head, head_labels,
                                     hops, kind, from_reached):
                continue  # backward() has run through it: nothing below it is saved any more
            try:
                nexts = node.next_functions
            except Exception:
                continue
            for pair in nexts:
                child = pair[0]
                if child is not None:
                    stack.append((child, hops + 1))
            if len(settled) >= wanted:
                return placed, visited, None
    return placed, visited, None


def _read_saved(node, saved: tuple, locate, placed: dict, placed_already: dict, settled: set, head, head_labels,
                hops, kind, from_reached: bool) -> bool:
    """Place the blocks of the node's saved tensors; True when backward() has freed them (one
    raised and none was there: backward() frees them together, and an unsaved one reads None)."""
    raised = present = False
    for name in saved:
        try:
            value = getattr(node, name)
        except Exception:
            raised = True  # freed by backward(), or changed in place since it was saved
            continue
        if value is None:
            continue
        for v in (value if type(value) in (tuple, list) else (value,)):
            if v is None or not kind(v):
                continue
            present = True
            key = locate(v)
            if key is None or key in placed_already or key in settled:
                continue
            found = placed.get(key)
            if found is None:
                found = placed[key] = []
            elif any(h is head for h, _ in found):
                continue
            found.append((head, [*head_labels, *[".next_functions[0]"] * hops, f".{name}"]))
            if from_reached or len(found) == MAX_HEADS:
                settled.add(key)
    return raised and not present
