"""The exit search's first move: a sweep down from the program's roots that looks at each object it
reaches for a tensor whose memory lies in a block, and stops as soon as every block has one.

At a program's end its blocks are mostly its model, its optimizer's state and its data, all a few
references from its modules: the sweep finds a tensor for every block after a few thousand objects
(timm's ResNet-50 with an EMA copy on an H100: 1,129 blocks, 7,803 objects, 20-35 ms), where the
full search first passes over every object the garbage collector tracks (378,000 there, 48-64 ms).

What no tensor holds stays open: on a GPU that is PyTorch's cuBLAS workspaces, one block per stream
and thread that ran a matrix product (32 MiB each on an H100 or H200, and a 1 MiB cuBLASLt one;
measured by benchmarks/workspace_blocks.py). Only blocks of a workspace's size (`workspace_sizes`)
are taken for one, and only on trust: the exit confirms it after its last reading, when clearing
the workspaces must give back exactly those bytes on each device (exit._confirm; where they do
not, the full search is made then). Anything else left open (by a sweep that ran out of objects
to reach, or was cut short at MAX_OBJECTS), and the full search is made instead (search.Finder.run).
"""
from __future__ import annotations

import itertools
import os

from . import heap
from .anchors import _Nothing, array_block, foreign_array_types
from .blocks import Spans, subclasses, tensor_field

MAX_OBJECTS = 20_000  # objects the first sweep reaches before it leaves the rest to the full search
SHARE = 0.3  # of the search's budget
MAX_WORKSPACES = 32  # blocks taken for workspaces at most: more is not a few streams and threads
KIB = 1024
# PyTorch's defaults when the environment sets none: CUBLAS_WORKSPACE_CONFIG ":4096:8" from compute
# capability 9.0 (Hopper) on, ":4096:2:16:8" before it; a cuBLASLt workspace of 1024 KiB.
DEFAULT_CUBLAS_KIB = (4096 * 8, 4096 * 2 + 16 * 8)
DEFAULT_CUBLASLT_KIB = (1024,)


def workspace_sizes(env=os.environ) -> frozenset:
    """The sizes in bytes that a cuBLAS or cuBLASLt workspace block has in this process."""
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    cublas = DEFAULT_CUBLAS_KIB
    if config:
        try:
            numbers = [int(n) for n in config.strip(":").split(":")]
            cublas = (sum(size * count for size, count in zip(numbers[::2], numbers[1::2])),)
        except ValueError:
            cublas = ()
    lt = DEFAULT_CUBLASLT_KIB
    if env.get("CUBLASLT_WORKSPACE_SIZE"):
        try:
            lt = (int(env["CUBLASLT_WORKSPACE_SIZE"]),)
        except ValueError:
            lt = ()
    return frozenset(k * KIB for k in (*cublas, *lt) if k > 0)


class TensorSweep(heap.Sweep):
    """A sweep whose targets are the blocks: each tensor (or another library's array) it reaches
    whose memory lies in a block not yet covered becomes that block's anchor, as the full search's
    anchors are (anchors.py: the tensor, or a leaf whose .grad lies there). `anchors`: id -> object;
    `holders`: id -> [(block key, suffix labels)]; `found`: id -> depth reached."""

    def __init__(self, torch, spans: Spans, seen: set, allow, allow_object, budget: heap.Budget):
        super().__init__(set(), seen, allow, allow_object, budget, max_objects=MAX_OBJECTS)
        self.spans = spans
        self.tensor_types = subclasses(torch.Tensor)
        self.wanted = self.tensor_types | foreign_array_types()
        self.open = set(range(len(spans)))  # the blocks no anchor covers yet
        self.anchors: dict = {}
        self.holders: dict = {}
        self.tensors = 0  # tensors reached
        self.guard = getattr(getattr(torch, "_C", None), "DisableTorchFunctionSubclass", None)

    def run(self, roots: list) -> None:
        # A tensor subclass's __torch_function__ is the program's code: not run while reading.
        with self.guard() if self.guard is not None else _Nothing():
            super().run(roots)

    def _done(self) -> bool:
        return not self.open

    def _hits(self, objs: list, depth: int) -> None:
        for obj in itertools.compress(objs, map(self.wanted.__contains__, map(type, objs))):
            if type(obj) in self.tensor_types:
                self.tensors += 1
                self._tensor(obj, depth)
            else:
                found_in = array_block(obj, self.spans)
                if found_in is not None:
                    self._cover(obj, *found_in, depth)

    def _cover(self, obj, key, suffix: list, depth: int) -> None:
        if key is None or key not in self.open:
            return
        self.open.discard(key)
        self.anchors[id(obj)] = obj
        self.holders.setdefault(id(obj), []).append((key, suffix))
        self.found.setdefault(id(obj), depth)

    def _tensor(self, t, depth: int) -> None:
        self._cover(t, self.spans.of_tensor(t), [], depth)
        try:
            if not tensor_field(t, "requires_grad") or tensor_field(t, "grad_fn") is not None:
                return
            g = tensor_field(t, "grad")
        except Exception:
            return
        if g is not None:
            self._cover(t, self.spans.of_tensor(g), [".grad"], depth)


def open_workspaces(open_keys, blocks: list, sizes: frozenset) -> dict | None:
    """{device: [bytes, count]} of the blocks left open where every one of them has a workspace's
    size and there are few enough; None otherwise (the full search decides)."""
    if len(open_keys) > MAX_WORKSPACES:
        return None
    out: dict = {}
    for key in open_keys:
        b = blocks[key]
        if b["size"] not in sizes:
            return None
        entry = out.setdefault(b["device"], [0, 0])
        entry[0] += b["size"]
        entry[1] += 1
    return out
