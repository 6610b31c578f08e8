"""Other GPU libraries in the process (JAX/XLA, CuPy, Numba, TensorFlow): when each was imported,
what their own pools hold at exit, and the arrays of theirs that are alive then.

The import is seen without changing the program, as torch's is (startup.TorchImportWatcher): a
meta-path finder that lets the import go on and writes a `library` record once the module has
run. The supervisor's NVML polls give the process's memory at that moment: what it held before
the library could touch the GPU. At exit, a library's own figures are read only where the library
has already started on the GPU (a look never starts one): XLA's pool from JAX's device
statistics, CuPy's pool as before (exit.py). Arrays that other libraries own are found in one
pass over the garbage collector's objects, by the `__cuda_array_interface__` of their type.
"""
from __future__ import annotations

import gc
import sys
import time

from ..startup import _NotifyingLoader

KNOWN = ("jax", "cupy", "numba", "tensorflow")
MAX_ARRAY_TYPES = 8


class LibraryWatcher:
    """A meta-path finder that calls `on_import(name)` after each known library's first import."""

    def __init__(self, on_import):
        self._on_import = on_import
        self.pending = set(KNOWN)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)  # before the search below, which asks this finder again
        if not self.pending:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None or finder is self:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, lambda module: self._on_import(name))
                return spec
        return None


def record(name: str) -> dict:
    return {"type": "library", "t": time.monotonic(), "name": name}


PREALLOCATING = ("jax",)  # whose pool is read at PyTorch's first allocation too (read_first_pools)


def pools() -> list[dict]:
    """What preallocating libraries hold on each GPU, from their own statistics: XLA's pool where
    JAX has started a GPU backend (never started here). The backends JAX has already made are read
    as they are, without JAX's lock or its `local_devices()` (which would make them)."""
    out: list[dict] = []
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None) if bridge is not None else None
    if backends:
        try:
            devices = [d for backend in list(backends.values()) for d in backend.local_devices()]
            for device in devices:
                if getattr(device, "platform", "") not in ("gpu", "cuda", "rocm"):
                    continue
                stats = device.memory_stats() or {}
                for field in ("pool_bytes", "bytes_reserved", "bytes_limit"):
                    if stats.get(field):
                        out.append({"name": "jax", "device": int(getattr(device, "local_hardware_id", None)
                                                                  or device.id), "bytes": int(stats[field]),
                                    "field": field, "in_use_bytes": int(stats.get("bytes_in_use") or 0)})
                        break
        except Exception:
            pass
    return out


def read_first_pools() -> list[dict]:
    """The pools of preallocating libraries already started, read once at PyTorch's first
    allocation, where the context is read: by exit the library may have let its backends go (its
    own atexit hook runs before the agent's), and then only this reading says what the pool was."""
    if not any(name in sys.modules for name in PREALLOCATING):
        return []
    try:
        return pools()
    except Exception:
        return []


def foreign_arrays() -> list[list]:
    """[type, count, bytes] of the live arrays of other libraries (their type has
    `__cuda_array_interface__`; PyTorch's tensors are left out), biggest first."""
    found: dict = {}
    array_type: dict = {}  # type -> whether it is another library's array (read from the type's own dicts)
    for obj in gc.get_objects():
        kind = type(obj)
        is_array = array_type.get(kind)
        if is_array is None:
            is_array = array_type[kind] = (any("__cuda_array_interface__" in vars(k) for k in kind.__mro__)
                                           and not kind.__module__.startswith("torch"))
        if not is_array:
            continue
        name = f"{kind.__module__}.{kind.__qualname__}"
        entry = found.setdefault(name, [name, 0, 0])
        entry[1] += 1
        try:
            face = obj.__cuda_array_interface__
            size = _itemsize(face.get("typestr", ""))
            for n in face.get("shape", ()):
                size *= int(n)
            entry[2] += size
        except Exception:
            pass
    return sorted(found.values(), key=lambda e: -e[2])[:MAX_ARRAY_TYPES]


def _itemsize(typestr: str) -> int:
    digits = "".join(c for c in typestr if c.isdigit())
    return int(digits) if digits else 1
