"""What the agent records besides samples: the garbage collections that freed CUDA memory,
out-of-memory errors at the moment they happen, where a process started CUDA, and the
exception a program died of. Runs inside the target; the agent guards every call.

The agent must not change when the program's garbage is collected. An automatic
collection starts when the count of new gc-tracked objects passes a threshold, so
reading the allocator (a nested dict from PyTorch) could set one off early. On the
program's own threads the agent holds automatic collection off while it reads
(`quiet_gc`), exactly as the program would by calling gc.disable() itself; on the
agent's own thread it never touches the collector's settings and reads only when
the count is far enough from the threshold (`gc_headroom`).
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# gc-tracked objects one reading of every device can create at most: PyTorch's nested stats
# are 39 dicts per device (measured, torch 2.11); most come from the dict free list.
GC_HEADROOM = 160
MIN_FREED_RECORD_BYTES = 1 << 20  # a collection that freed less CUDA memory is only counted
MAX_COLLECTION_RECORDS = 1000  # then collections are only added up
GC_COST_SHARE = 0.01  # the callback stops measuring while it has cost more than this share of the run
MAX_STACK = 16


class quiet_gc:
    """No automatic collection inside the block, on the program's own thread only."""

    __slots__ = ("was",)

    def __enter__(self):
        self.was = gc.isenabled()
        if self.was:
            gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()
        return False


def gc_headroom() -> bool:
    """True when reading the allocator now cannot push the collector over its threshold."""
    if not gc.isenabled():
        return True
    threshold = gc.get_threshold()[0]
    return threshold == 0 or gc.get_count()[0] + GC_HEADROOM < threshold


def program_stack(frame, limit: int = MAX_STACK) -> list:
    """[file, line, function] from `frame` outwards, innermost first, without gpumemdoctor's frames."""
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            out.append([code.co_filename, frame.f_lineno or 0, code.co_name])
        frame = frame.f_back
    return out


class Collections:
    """gc.callbacks: the CUDA memory each collection freed, whoever set it off.

    Tensors that live until a collection are garbage held by reference cycles, even
    when nothing is left of them at exit. Reading `allocated` costs about 11 us per
    device, twice a collection; collections are rare in tensor code (one per 500
    steps of an AdamW loop on an H100), and the callback stops measuring while it
    has cost more than GC_COST_SHARE of the time since CUDA started.
    """

    def __init__(self, read_allocated, write, steps):
        self.read_allocated = read_allocated  # () -> {torch index: allocated bytes}
        self.write = write
        self.steps = steps  # () -> the step count now
        self.started = time.perf_counter()
        self.paused = False
        self.before = None
        self.measured = 0
        self.skipped = 0
        self.freeing = 0  # collections that freed CUDA memory (at least MIN_FREED_RECORD_BYTES)
        self.freed_bytes = 0
        self.max_freed_bytes = 0
        self.records = 0
        self.cost_s = 0.0

    def install(self) -> None:
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)

    def callback(self, phase, info) -> None:
        try:
            if self.paused:
                return
            now = time.perf_counter()
            if phase == "start":
                if self.cost_s > GC_COST_SHARE * (now - self.started) + 0.002:
                    self.skipped += 1
                    self.before = None
                    return
                self.before = (now, self.read_allocated())
                self.cost_s += time.perf_counter() - now
                return
            if self.before is None:
                return
            t0, before = self.before
            self.before = None
            after = self.read_allocated()
            self.measured += 1
            freed = {i: before[i] - after.get(i, 0) for i in before if before[i] - after.get(i, 0) > 0}
            total = sum(freed.values())
            if total >= MIN_FREED_RECORD_BYTES:
                self.freeing += 1
                self.freed_bytes += total
                self.max_freed_bytes = max(self.max_freed_bytes, total)
                if self.records < MAX_COLLECTION_RECORDS:
                    self.records += 1
                    self.write({"type": "collection", "t": time.monotonic(), "step": self.steps(),
                                "generation": int(info.get("generation", -1)),
                                "collected": int(info.get("collected", 0)),
                                "freed": [[i, b] for i, b in sorted(freed.items())],
                                "thread": threading.current_thread().name,
                                "stack": program_stack(sys._getframe(), 6),
                                "elapsed_s": round(time.perf_counter() - t0, 6)})
            self.cost_s += time.perf_counter() - now
        except Exception:
            self.before = None

    def summary(self) -> dict:
        return {"measured": self.measured, "skipped": self.skipped, "freeing": self.freeing,
                "freed_bytes": self.freed_bytes, "max_freed_bytes": self.max_freed_bytes,
                "cost_s": round(self.cost_s, 6)}


def free_blocks(torch, device: int) -> tuple[int | None, int | None]:
    """(largest free block, all free blocks) inside the allocator's segments on one device."""
    try:
        segments = torch.cuda.memory._snapshot()["segments"]
    except Exception:
        return None, None
    largest = total = 0
    for segment in segments:
        if segment.get("device") != device:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") == "inactive":
                total += block["size"]
                largest = max(largest, block["size"])
    return largest, total


def out_of_memory(torch, device: int, request: int, limit: int, device_free: int, processes) -> dict:
    """The figures of an out-of-memory error, read at the moment the allocator gives up
    (PyTorch's out-of-memory observer runs on the allocating thread, before the stack unwinds)."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)

    def stat(name: str) -> int | None:
        try:
            return int(stats[name]["all"]["current"])
        except (KeyError, TypeError, ValueError):
            return None

    largest, free_total = free_blocks(torch, device)
    return {"type": "oom", "t": time.monotonic(), "device": device, "request_bytes": int(request),
            "limit_bytes": int(limit), "device_free_bytes": int(device_free),
            "allocated_bytes": stat("allocated_bytes"), "reserved_bytes": stat("reserved_bytes"),
            "active_bytes": stat("active_bytes"), "largest_free_block_bytes": largest,
            "free_in_segments_bytes": free_total,
            "processes": [[int(pid), used] for pid, used in processes],
            "thread": threading.current_thread().name,
            "stack": program_stack(sys._getframe())}


def cuda_origin() -> dict:
    """Where this process started CUDA, and whether it is a DataLoader worker or a
    multiprocessing child: processes that often should not hold a context of their own."""
    worker = None
    module = sys.modules.get("torch.utils.data._utils.worker")
    info = getattr(module, "_worker_info", None) if module is not None else None
    if info is not None:
        worker = {"id": int(getattr(info, "id", -1)), "num_workers": int(getattr(info, "num_workers", -1))}
    mp_child = False
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        try:
            mp_child = mp.parent_process() is not None
        except Exception:
            mp_child = False
    return {"thread": threading.current_thread().name, "stack": program_stack(sys._getframe()),
            "dataloader_worker": worker, "multiprocessing_child": mp_child}


def uncaught() -> dict | None:
    """The exception the program is dying of, if one reached the top (read at exit)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None:
        return None
    frames = []
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append([code.co_filename, tb.tb_lineno, code.co_name])
        tb = tb.tb_next
    kind = type(exc)
    return {"exc_type": f"{kind.__module__}.{kind.__qualname__}".replace("builtins.", ""),
            "message": str(exc)[:800], "stack": frames[::-1][:MAX_STACK]}


def import_in_progress() -> bool:
    """True while some module is still being imported (by any thread)."""
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return True
    return False
