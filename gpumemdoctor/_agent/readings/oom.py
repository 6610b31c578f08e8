"""The out-of-memory observer: what PyTorch's allocator could not serve, and who held the memory then.

PyTorch calls it on the allocating thread, before the stack unwinds. The first error of a
process is also searched for holders (watch.py); MAX_OOM_RECORDS are recorded in all.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from ..search.blocks import snapshot
from .events import program_stack
from ..neutral import quiet_gc

MAX_OOM_RECORDS = 20  # out-of-memory errors recorded per process; the first is searched for holders


class OomObserver:
    """Attached to PyTorch's allocator at CUDA's start (`torch._C._cuda_attach_out_of_memory_observer`)."""

    def __init__(self, shared, peak_watch, growth_watch):
        self.shared = shared
        self.peak_watch = peak_watch  # the step's state: its optimizers, where the main thread is
        self.growth_watch = growth_watch  # the first error's search
        self.records = 0

    def observe(self, device, request, limit, device_free) -> None:
        """PyTorch's allocator could not serve a request: the figures and who held the memory,
        now, on the allocating thread, before the stack unwinds."""
        shared = self.shared
        try:
            if self.records >= MAX_OOM_RECORDS or shared.finished:
                return
            self.records += 1
            with quiet_gc():
                processes = []
                d = next((d for d in shared.devices if d["index"] == device), None)
                if shared.nvml is not None and d is not None and d["nvml_device"] is not None:
                    try:
                        processes = shared.nvml.processes(d["nvml_device"])
                    except Exception:
                        processes = []
                record = out_of_memory(shared.torch, device, request, limit, device_free, processes)
                record["step"] = shared.steps
                record["inputs"] = module_inputs(shared.torch, sys._getframe())
                if shared.step_inputs is not None and shared.step_inputs.largest:
                    record["earlier_inputs"] = shared.step_inputs.earlier()  # the steps before this one
                record["memory_fraction"] = _fraction(shared.torch, device)
                record.update(_state_of_the_step(shared.torch, self.peak_watch, device))
                shared.channel.write(record)
                if self.records == 1:
                    self.growth_watch.search("oom")
        except Exception:
            pass


def _state_of_the_step(torch, peak_watch, device: int) -> dict:
    """What the optimizers held at the error, and where the program was in its step: what it could
    have freed (diagnosis/fit.py). `inside` is the main thread's: on CUDA, backward() runs on
    PyTorch's own worker threads, whose error has no frame of the program, while the main thread
    waits inside backward(). `grad_enabled` is the failing thread's grad mode (an evaluation under
    torch.no_grad() has it off), `paused` whether the steps had paused (an evaluation between them).
    Anything that cannot be read is left out: the error's own record is written regardless."""
    out: dict = {}
    try:
        out["optimizers"] = json.loads("[" + peak_watch.optimizer_figures(device, [0, 0, 0]) + "]")
        out["inside"] = peak_watch.main_thread_place()[1]
        out["grad_enabled"] = bool(torch.is_grad_enabled())
        out["paused"] = peak_watch.paused()
    except Exception:
        pass
    return out


def _fraction(torch, device: int) -> float | None:
    """The per-process memory fraction in force (1.0 where none was set); None where PyTorch cannot say."""
    try:
        return float(torch.cuda.get_per_process_memory_fraction(device))
    except Exception:
        return None


MAX_INPUTS = 8  # tensors named of the outermost module call's arguments


def module_inputs(torch, frame) -> list[list]:
    """[[name, shape, dtype]]: the tensors passed to the outermost module call on this thread's stack
    (nn.Module._call_impl's args and kwargs: `input_ids`, `args[0]`), or, on a thread that runs no module
    (backward()'s workers), the main thread's. What this step was asked to do, against the steps before.
    [] where none can be read."""
    try:
        return _module_inputs(torch, frame)
    except Exception:
        return []


def _module_inputs(torch, frame) -> list[list]:
    outermost = None
    for f in _frames(frame):
        if f.f_code.co_name == "_call_impl" and f.f_code.co_filename.endswith(MODULE_FILE):
            outermost = f
    if outermost is None:
        main = sys._current_frames().get(threading.main_thread().ident)
        for f in _frames(main):
            if f.f_code.co_name == "_call_impl" and f.f_code.co_filename.endswith(MODULE_FILE):
                outermost = f
    if outermost is None:
        return []
    found = []
    named = [(f"args[{i}]", a) for i, a in enumerate(outermost.f_locals.get("args") or ())]
    named += list((outermost.f_locals.get("kwargs") or {}).items())
    for name, value in named:
        if isinstance(value, torch.Tensor) and len(found) < MAX_INPUTS:
            found.append([str(name), [int(n) for n in value.shape], str(value.dtype).removeprefix("torch.")])
    return found


MODULE_FILE = os.path.join("torch", "nn", "modules", "module.py")


def _frames(frame):
    depth = 0
    while frame is not None and depth < 300:
        yield frame
        frame = frame.f_back
        depth += 1


def free_blocks(torch, device: int) -> tuple[int | None, int | None]:
    """(largest free block, all free blocks) inside the allocator's segments on one device."""
    try:
        segments = snapshot(torch)["segments"]
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
