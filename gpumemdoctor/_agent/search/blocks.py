"""The allocator's view, inside the target: live blocks with their stacks, and which objects are tensors.

What the holder search (search.py) and the garbage look-up (garbage.py) stand on. Tensors
are matched to allocator blocks by the address range of their storage, so all of it works
the same on CPU tensors (that is how the CPU tests exercise it).
"""
from __future__ import annotations

import bisect
import gc
import itertools
import os
import sys
import sysconfig

# gpumemdoctor's own folder, not this package's: its frames are never the program's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBRARY_DIRS = tuple({os.path.abspath(p) for p in (sysconfig.get_paths().get("stdlib"),
                                                    sysconfig.get_paths().get("platstdlib"),
                                                    sysconfig.get_paths().get("purelib"),
                                                    sysconfig.get_paths().get("platlib")) if p})


# is_library_file's answers for absolute file names (a relative one depends on the working
# folder): asked for every frame of the stacks a search groups and of the frames a peak's probe
# looks at, thousands of times for a few hundred distinct files.
_LIBRARY_FILES: dict = {}
MAX_CACHED_FILES = 4096


def is_library_file(filename: str) -> bool:
    """The standard library, installed packages, or gpumemdoctor itself: not the user's code."""
    known = _LIBRARY_FILES.get(filename)
    if known is not None:
        return known
    if not filename or filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    answer = (path.startswith(PACKAGE_DIR) or "site-packages" in path or "dist-packages" in path
              or any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS))
    if filename.startswith(os.sep) and len(_LIBRARY_FILES) < MAX_CACHED_FILES:
        _LIBRARY_FILES[filename] = answer
    return answer


class Spans:
    """Address ranges [start, end) with a key each, looked up by any address inside."""

    def __init__(self, spans):
        self._spans = sorted((int(s), int(s) + int(n), key) for s, n, key in spans if n)
        self._starts = [s for s, _, _ in self._spans]

    def __len__(self) -> int:
        return len(self._spans)

    def sizes(self) -> dict:
        """key -> bytes of each span."""
        return {key: end - start for start, end, key in self._spans}

    def find(self, address: int):
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._spans[i][1]:
            return self._spans[i][2]
        return None

    def of_tensor(self, tensor):
        """The key of the span that holds the tensor's first element, found without making its
        storage object (for the many saved tensors of autograd graphs: 8% of a graph walk's time
        on CPU); an empty tensor's by its storage."""
        address = data_address(tensor)
        if not address:
            span = storage_span(tensor)
            address = span[0] if span is not None else 0
        return self.find(address) if address else None


class TensorKind:
    """Is this object a tensor? Decided from its type alone (cached): `isinstance` would
    call `__class__` on every object of the heap, and some modules answer that with warnings."""

    def __init__(self, torch):
        self._tensor = torch.Tensor
        self._cache: dict = {}

    def __call__(self, obj) -> bool:
        t = type(obj)
        known = self._cache.get(t)
        if known is None:
            try:
                known = self._cache[t] = issubclass(t, self._tensor)
            except TypeError:
                known = self._cache[t] = False
        return known


_base: list = []  # [PyTorch's C tensor type], once torch is imported and it is found
_readers: dict = {}  # field name -> PyTorch's C accessor of it, bound once


def _tensor_base():
    if not _base:
        c = getattr(sys.modules.get("torch"), "_C", None)
        base = getattr(c, "TensorBase", None) or getattr(c, "_TensorBase", None)
        if not isinstance(base, type):
            return None  # no torch yet (or a stand-in): looked up again next time
        _base.append(base)
    return _base[0]


def tensor_field(tensor, name: str):
    """tensor.<name> (requires_grad, grad_fn, grad, is_leaf, is_cuda, device) as PyTorch's C
    accessor reads it: a subclass may define a property of that name, and that is the program's
    code."""
    base = _tensor_base()
    if base is not None and issubclass(type(tensor), base):
        read = _readers.get(name)
        if read is None:
            read = _readers[name] = getattr(base, name).__get__
        return read(tensor)
    return getattr(tensor, name)


def storage_span(tensor):
    """(address, bytes) of the tensor's storage; None where it has no plain storage. Read
    through PyTorch's own method, never a subclass's override."""
    try:
        base = _tensor_base()
        if base is not None and issubclass(type(tensor), base):
            storage = base.untyped_storage(tensor)
        else:
            storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except Exception:
        return None


def data_address(tensor) -> int:
    """The address of the tensor's first element through PyTorch's own method (0 for an empty
    tensor, or where it has none): it lies inside the tensor's storage, so it finds the block as the
    storage's address does, without making a storage object."""
    try:
        base = _tensor_base()
        if base is not None and issubclass(type(tensor), base):
            return base.data_ptr(tensor)
    except Exception:
        pass
    return 0


class no_inductor_import:
    """While PyTorch names the Python frames of a snapshot it asks `hasattr(torch, "_inductor")`,
    and torch answers by importing torch._inductor: 4-6 s and some 880 modules the program never
    imported (measured on an H100 machine, torch 2.11), once per process. Where the program has
    not imported it, torch is given, for the time of the call, an `_inductor` with no
    `codecache`, so the frames are named without it (there are no compiled frames to name)."""

    def __init__(self, torch):
        self.torch = torch
        self.stub = None

    def __enter__(self):
        attrs = getattr(self.torch, "__dict__", None)
        if type(attrs) is dict and "_inductor" not in attrs and "torch._inductor" not in sys.modules:
            self.stub = attrs["_inductor"] = _NoInductor()
        return self

    def __exit__(self, *exc):
        attrs = self.torch.__dict__
        if self.stub is not None and attrs.get("_inductor") is self.stub:
            del attrs["_inductor"]
        return False


class _NoInductor:
    __slots__ = ()


def quiet_program_snapshots(torch) -> bool:
    """The program's own allocator snapshots (`torch.cuda.memory_snapshot()`, `_snapshot()`,
    `_dump_snapshot()`: all go through `torch._C._cuda_memorySnapshot`) taken under no_inductor_import
    too. Without the tool no history is recorded and a snapshot names no frames; under it, the history
    that the tool records makes PyTorch name them, and its first question imported torch._inductor:
    a program's one `memory_snapshot()` after a loop took 6.75 s under `run` against 1 ms plain (H200,
    2026-12-04, scenarios/leak_cuda_graph_pools.py). False where there is no such function to wrap."""
    c = getattr(torch, "_C", None)
    original = getattr(c, "_cuda_memorySnapshot", None)
    if original is None:
        return False
    if getattr(original, "__gpumemdoctor__", False):
        return True

    def _cuda_memorySnapshot(*args, **kwargs):
        with no_inductor_import(torch):
            return original(*args, **kwargs)

    _cuda_memorySnapshot.__wrapped__ = original
    _cuda_memorySnapshot.__gpumemdoctor__ = True
    _cuda_memorySnapshot.__doc__ = getattr(original, "__doc__", None)
    c._cuda_memorySnapshot = _cuda_memorySnapshot
    return True


# Every pool's segments (pool (0, 0)) without the allocator's event ring (False: PyTorch's
# include_traces, in 2.11 and newer). The whole snapshot converts every event of the ring and its
# stack into Python objects: 2.1-2.8 ms for the growth watch's baseline of 46 blocks on an H200 with
# the peak's history on (issue 57), hundreds of ms for a ring of 100,000 events.
SEGMENTS_ONLY = (0, 0, False)
_INCREF: list = []  # ctypes' Py_IncRef, made at its first use (ctypes is not imported with the agent)


def py_incref():
    """ctypes' Py_IncRef, made once. PyTorch 2.11 takes a pool id's items as its own references and
    lets them go (a second call with the same tuple then read freed ints: "mempool_id elements must be
    integers", then a crash): each call with a pool id first gives it the references it will drop.
    Where a PyTorch drops none, the extra references keep a small int or False alive, no more."""
    if not _INCREF:
        import ctypes

        incref = ctypes.pythonapi.Py_IncRef
        incref.argtypes = [ctypes.py_object]
        incref.restype = None
        _INCREF.append(incref)
    return _INCREF[0]


def snapshot(torch) -> dict:
    """PyTorch's allocator snapshot for its segments (the event ring left out where this PyTorch
    can), without importing torch._inductor into the program."""
    with no_inductor_import(torch):
        memory_snapshot = getattr(getattr(torch, "_C", None), "_cuda_memorySnapshot", None)
        if memory_snapshot is not None:
            try:
                incref = py_incref()
                for item in SEGMENTS_ONLY:
                    incref(item)
                return memory_snapshot(SEGMENTS_ONLY)
            except (TypeError, ValueError, RuntimeError):
                pass  # an older PyTorch: a pool id of two items, or none
        return torch.cuda.memory._snapshot()


def live_blocks(torch, pools: bool = False) -> list[dict]:
    """Every block the allocator has handed out and not got back, with its allocation stack
    where history was being recorded when it was allocated. A private pool's segments (CUDA graphs'
    pools) are held by their graph, not by tensors: left out, or with `pools` each segment one block
    of its whole size, with its pool's id (`pool`) and the stack of its first allocated block (a
    graph's capture)."""
    taken = snapshot(torch)
    blocks = []
    for segment in taken.get("segments", []):
        device = segment.get("device")
        pool = segment.get("segment_pool_id")
        if pool is not None and tuple(pool) != (0, 0):
            if pools and segment.get("total_size"):
                blocks.append(_pool_segment(segment, tuple(pool)))
            continue
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            blocks.append({"device": device, "address": block["address"], "size": block["size"],
                           "frames": [(f.get("filename", "?"), f.get("line", 0), f.get("name", "?"))
                                      for f in block.get("frames") or []]})
    return blocks


def _pool_segment(segment: dict, pool: tuple) -> dict:
    """A private pool's segment as one block: its address and whole size, the stack of its first
    allocated block that has one (else of any block, else the segment's own)."""
    blocks = segment.get("blocks") or []
    with_frames = ([b for b in blocks if b.get("state") == "active_allocated" and b.get("frames")]
                   or [b for b in blocks if b.get("frames")])
    frames = with_frames[0]["frames"] if with_frames else segment.get("frames") or []
    return {"device": segment.get("device"), "address": segment["address"], "size": int(segment["total_size"]),
            "pool": [int(pool[0]), int(pool[1])],
            "frames": [(f.get("filename", "?"), f.get("line", 0), f.get("name", "?")) for f in frames]}


def graph_types(torch) -> set:
    """torch.cuda.CUDAGraph and its subclasses, where this PyTorch has them (a CUDA build)."""
    base = getattr(getattr(torch, "_C", None), "_CUDAGraph", None)
    return subclasses(base) if isinstance(base, type) else set()


def subclasses(cls) -> set:
    """A class and every subclass of it that exists now."""
    out, todo = set(), [cls]
    while todo:
        c = todo.pop()
        if c not in out:
            out.add(c)
            try:
                todo.extend(type.__subclasses__(c))
            except TypeError:
                pass
    return out


def graph_pool(torch, graph) -> tuple | None:
    """The id of a CUDA graph's private memory pool, through PyTorch's own method (never a subclass's
    override); None where it has none (never captured) or cannot say."""
    try:
        pool = torch._C._CUDAGraph.pool(graph)
        return int(pool[0]), int(pool[1])
    except Exception:
        return None


def cuda_tensors(kind: TensorKind):
    """(tensor, storage address, storage bytes) of every CUDA tensor the garbage collector knows."""
    for obj in gc.get_objects():
        if not kind(obj):
            continue
        try:
            span = storage_span(obj) if tensor_field(obj, "is_cuda") else None
        except Exception:
            continue
        if span:
            yield obj, span[0], span[1]


def user_frames(frames: list) -> list:
    """The allocating stack without PyTorch's own frames, innermost first, each run of library
    frames (the standard library, installed packages) kept as its outermost frame: the call the
    program made. So a deep library call (copy.deepcopy's recursion through a model) cannot push
    the program's own line out of the frames a group keeps (search.MAX_FRAMES). Frames in the
    folder of the program's main file are its own, also where it lives among installed packages."""
    kept = [f for f in frames if not _is_torch_file(f[0]) and not f[0].startswith(PACKAGE_DIR)] or frames
    program = _program_dir()
    out: list = []
    for library, run in itertools.groupby(kept, key=lambda f: is_library_file(f[0]) and not (
            program and os.path.abspath(f[0]).startswith(program))):
        run = list(run)
        out.extend(run[-1:] if library else run)  # a library run: its outermost frame
    return out


def _program_dir() -> str | None:
    """The folder of the program's main file (with a trailing separator), if it has one."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) if main is not None else None
    return os.path.join(os.path.dirname(os.path.abspath(path)), "") if isinstance(path, str) else None


def _is_torch_file(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename


def thread_entry(frames: list):
    """(file, function) that a thread ran, when the stack runs through threading's bootstrap."""
    for i, (filename, _, name) in enumerate(frames):
        if name == "_bootstrap_inner" and filename.endswith("threading.py"):
            inner = [f for f in frames[:i] if not (f[0].endswith("threading.py") and f[2] == "run")]
            if inner:
                return inner[-1][0], inner[-1][2]
    return None


def take_baseline(torch, kind: TensorKind) -> dict:
    """What is alive now, so that a search later looks only at what came after (here, not in
    search.py: taken on the program's thread, which need not import the search for it)."""
    try:
        # address -> size: one dict of ints, which the garbage collector does not track
        blocks = {b["address"]: b["size"] for b in live_blocks(torch)}
    except Exception:
        blocks = {}
    return {"blocks": blocks,
            "storages": {address for _, address, _ in cuda_tensors(kind)} if not blocks else set()}
