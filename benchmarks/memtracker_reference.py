"""PyTorch's MemTracker on an unmodified program: the reference the tool's split of the allocated peak
is held to (issue 40). Run here only, never inside the tool.

    python benchmarks/memtracker_reference.py [--json PATH] [--enter start|late] PROGRAM [ARGS...]

The options come before PROGRAM; everything after it is the program's own. The program runs as
`python PROGRAM ARGS...` would run it (runpy, as `__main__`, `sys.argv` set, its folder first on
`sys.path`, so a corpus program's `from _common import ...` works), with
`torch.distributed._tools.mem_tracker.MemTracker` injected from outside:

- `--enter start` (the default): the tracker is entered before the program's first line, so it sees
  every tensor the program makes and every step, the first one's included. Parameters made before
  their module's first forward count as activations until that forward (MemTracker's own rule), and
  so do the weights of a module that is never run (a model EMA's copy); the harness finds every
  module and optimizer itself (`gc.get_objects()`: root `nn.Module`s with parameters or buffers,
  `torch.optim.Optimizer`s, whatever wraps them) at the first root forward and after the first
  optimizer step, and hands them to `track_external`, which gives each module's parameters and
  buffers their categories.
- `--enter late`: entered at the end of the first root forward after the first optimizer step (of
  the first root forward, in a program with no optimizer at that moment), after `track_external`
  of what it found. It cannot see anything made before that moment but the modules' parameters,
  buffers and gradients and the optimizers' state: not the peak of a step before it was entered,
  not that forward's activations, not the program's other tensors (input batches, masks, caches).

MemTracker errs on a root module run a second time: before each root forward outside backward,
of a module it already tracks, the harness calls `reset_mod_stats()` (one iteration at a time, as
MemTracker asks). That keeps its global peak, which is what is written.

What MemTracker cannot see, entered at the start or not: memory the allocator hands out that is no
tensor's storage (cuBLAS's and cuBLASLt's workspaces, blocks made inside a kernel's call and freed
before it returns, such as cuDNN's workspace), and the allocator's rounding of a block beyond its
storage's 512 bytes; tensors that bypass the dispatcher's modes; tensors made in threads the
program starts itself (the mode is the main thread's; autograd's own threads take it on); the
allocator's cache and memory outside PyTorch (not allocated memory).

So that MemTracker's split can be read at the moment the tool splits, PyTorch's allocated peak, the
harness reads the allocator's peak counter at the end of every operator MemTracker sees, and resets
it: at its highest (`at_allocator_peak`), MemTracker's categories then (its current split, that
operator's outputs in it), what the allocator held beyond them inside the operator's call and freed
before it returned (`inside_operator`: a workspace) and across it (`beyond_memtracker`: no tracked
tensor's storage), the operator, whether inside backward() or an optimizer step, and the steps
counted. MemTracker's own peak, its highest total, is written as well (`peak`), with the allocator's
allocated memory read then. The counter being reset, `torch.cuda.max_memory_allocated()` means
nothing in this process; `max_memory_allocated` is the highest reading.

The JSON written (also when the program fails; its exit status is passed on, 77 included):
`command`, `program`, `args`, `torch`, `python`, `enter`, `entered` (when: the optimizer steps and
root forwards before it), `exit_code`, `error`, `skipped`, `elapsed_s`, `cannot_see`, `counts` (root
forwards, backward() calls, optimizer steps, resets, sweeps: in all, and with the tracker entered),
`modules` and `optimizers` found, and per device (`cuda:0`, or `cpu` with CORPUS_DEVICE=cpu): `peak`
(MemTracker's split at its own peak: `Parameter`, `Buffer`, `Gradient`, `Activation`, `Temp`,
`Optstate`, `Other`, `Total`, bytes), `allocated_at_peak`, `peak_phase`, `peak_step`,
`peak_root_forwards` (at that peak), `at_allocator_peak` (above; `null` on the CPU),
`optimizer_parameter_bytes` (the optimizers' parameters' storages there, rounded as the allocator
rounds), `max_memory_allocated`, `device_name`.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import runpy
import shlex
import sys
import time
import traceback
import warnings
import weakref

CANNOT_SEE = [
    "allocator blocks that are no tensor's storage: cuBLAS/cuBLASLt workspaces, blocks a kernel call makes and "
    "frees inside it (cuDNN's workspace); they are in allocated_at_peak, not in Total",
    "the allocator's rounding of a block beyond its storage's 512 bytes",
    "tensors made in threads the program starts itself (autograd's own take the mode on), or bypassing the "
    "dispatcher's modes",
    "the allocator's cache, the CUDA context and memory outside PyTorch: not allocated memory",
]
CANNOT_SEE_LATE = [
    "with --enter late: everything made before it was entered but modules' parameters, buffers and gradients and "
    "optimizers' state (the peak of a step before it, that forward's activations, input batches, masks)",
]
ALLOCATOR_ROUND = 512


def _round(n: int) -> int:
    return (n + ALLOCATOR_ROUND - 1) // ALLOCATOR_ROUND * ALLOCATOR_ROUND


class Harness:
    """Finds the program's modules and optimizers, enters and leaves the tracker, counts."""

    def __init__(self, torch, enter: str):
        from torch.distributed._tools.mem_tracker import MemTracker

        harness = self

        class Tracker(MemTracker):
            """MemTracker, plus a reading of the allocator at each new high of its total."""

            def _update_peak_stats(self, peak_state) -> None:
                # MemTracker's own update, run without its per-module peaks (a loop over every module
                # it tracks, at each operator: most of its cost, and nothing this harness writes).
                before = dict(getattr(self, "_peak_mem", {}))
                modules, self.memory_tracking = self.memory_tracking, {}
                try:
                    super()._update_peak_stats(peak_state)
                finally:
                    self.memory_tracking = modules
                for dev, total in getattr(self, "_peak_mem", {}).items():
                    if total != before.get(dev):
                        harness.on_new_peak(dev)

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = super().__torch_dispatch__(func, types, args, kwargs)
                harness.after_operator(func)
                return out

        self.torch = torch
        self.enter_mode = enter
        self.mt = Tracker()
        self.entered = None  # {"optimizer_steps": n, "root_forwards": n, "how": ...} once entered
        self.exited = False
        self.depth = 0
        self.counts = {k: 0 for k in ("root_forwards", "backwards", "optimizer_steps", "resets", "sweeps")}
        self.seen = {k: 0 for k in ("root_forwards", "backwards", "optimizer_steps")}
        self.at_peak: dict = {}  # device -> what was read at MemTracker's latest new high there
        self.allocator_peak: dict = {}  # device -> MemTracker's categories at the allocator's highest
        self.modules: dict = {}  # id -> {"type", "parameter_bytes", "buffer_bytes", "trained"}
        self.optimizers = weakref.WeakSet()
        self.optimizer_types: dict = {}
        self.optimizer_bytes: dict = {}  # device -> bytes (the largest seen)
        self.swept_after_step = False
        self.handles = []

    # -- the hooks ----------------------------------------------------------------------------------

    def install(self) -> None:
        torch = self.torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        # Registered before MemTracker's own global hooks (entered later), so these run first.
        self.handles.append(register_module_forward_pre_hook(self.pre_forward))
        self.handles.append(register_module_forward_hook(self.post_forward, always_call=True))
        self.handles.append(register_optimizer_step_post_hook(self.after_step))
        original = torch.autograd.backward
        harness = self

        def backward(*args, **kwargs):
            harness.counts["backwards"] += 1
            if harness.entered is not None and not harness.exited:
                harness.seen["backwards"] += 1
            return original(*args, **kwargs)

        torch.autograd.backward = backward
        self._original_backward = original

    def uninstall(self) -> None:
        for h in self.handles:
            h.remove()
        self.torch.autograd.backward = self._original_backward

    def in_backward(self) -> bool:
        return self.torch._C._current_graph_task_id() != -1

    def pre_forward(self, module, args) -> None:
        self.depth += 1
        if self.depth != 1 or self.in_backward():
            return
        self.counts["root_forwards"] += 1
        if self.entered is not None and not self.exited:
            self.seen["root_forwards"] += 1
            if self.counts["sweeps"] == 0:
                self.sweep()
            if module in self.mt.memory_tracking:
                self.mt.reset_mod_stats()  # one iteration at a time, as MemTracker asks
                self.counts["resets"] += 1

    def post_forward(self, module, args, output) -> None:
        self.depth -= 1
        if self.depth != 0 or self.in_backward() or self.entered is not None or self.enter_mode != "late":
            return
        if self.counts["optimizer_steps"] == 0:
            self.sweep()
            if self.optimizer_types:
                return  # an optimizer exists: wait for its first step
        self.enter("at the end of the first root forward after the first optimizer step"
                   if self.counts["optimizer_steps"] else "at the end of the first root forward (no optimizer)")

    def after_step(self, optimizer, args, kwargs) -> None:
        self.counts["optimizer_steps"] += 1
        if self.entered is not None and not self.exited:
            self.seen["optimizer_steps"] += 1
        self.optimizer_types[id(optimizer)] = type(optimizer).__name__
        self._count_optimizer_bytes(optimizer)
        if not self.swept_after_step and self.entered is not None:
            self.swept_after_step = True
            self.sweep()

    def phase(self) -> str:
        if self.in_backward():
            return "backward"
        if getattr(self.mt, "_in_opt", False):
            return "optimizer step"
        return "outside"

    def on_new_peak(self, dev) -> None:
        """A new high of MemTracker's total: the allocator's allocated memory then, and when it came."""
        allocated = None
        if dev.type == "cuda":
            allocated = self.torch.cuda.memory_stats_as_nested_dict(dev)["allocated_bytes"]["all"]["current"]
        self.at_peak[str(dev)] = {"allocated_at_peak": allocated, "peak_phase": self.phase(),
                                  "peak_step": self.counts["optimizer_steps"],
                                  "peak_root_forwards": self.counts["root_forwards"]}

    def after_operator(self, func) -> None:
        """The allocator's peak counter since the last operator ended, read and reset at each one's end
        on every GPU MemTracker has seen: at a new high, MemTracker's categories then (its current
        split, the operator's outputs in it) and what the allocator held beyond them, inside the
        operator's call (freed before it returned: a workspace) and across it (no tensor's storage)."""
        torch = self.torch
        try:
            devices = [d for d in list(self.mt._curr_mem_snap) if d.type == "cuda"]
        except RuntimeError:  # (a storage freed meanwhile emptied a device's entry: the next operator reads it)
            return
        for dev in devices:
            stats = torch.cuda.memory_stats_as_nested_dict(dev).get("allocated_bytes", {}).get("all")
            if not stats:
                continue
            name = str(dev)
            if stats["peak"] > self.allocator_peak.get(name, {}).get("allocated", -1):
                cats = self.mt._curr_mem_snap.get(dev, {})
                categories = {str(getattr(k, "value", k)): int(v) for k, v in cats.items()}
                total = categories.pop("Total", 0)
                self.allocator_peak[name] = {
                    "allocated": stats["peak"], "allocated_after_operator": stats["current"],
                    "inside_operator": stats["peak"] - stats["current"],
                    "beyond_memtracker": max(0, stats["current"] - total), "memtracker_total": total,
                    "categories": categories, "operator": str(func), "phase": self.phase(),
                    "step": self.counts["optimizer_steps"], "root_forwards": self.counts["root_forwards"]}
            torch.cuda.reset_peak_memory_stats(dev)

    # -- finding what to track ----------------------------------------------------------------------

    def sweep(self) -> None:
        """Every root nn.Module with parameters or buffers, and every optimizer, handed to MemTracker."""
        torch = self.torch
        self.counts["sweeps"] += 1
        modules, optimizers = [], []
        with warnings.catch_warnings():  # (a lazy module's deprecation warning on the type check)
            warnings.simplefilter("ignore")
            for o in gc.get_objects():
                try:
                    if issubclass(type(o), torch.nn.Module):  # (not a weakref proxy to one)
                        modules.append(o)
                    elif issubclass(type(o), torch.optim.Optimizer):
                        optimizers.append(o)
                except Exception:  # an object whose type check fails: not ours
                    continue
        children = set()
        for m in modules:
            for c in m.children():
                children.add(id(c))
        trained = set()
        for opt in optimizers:
            self.optimizer_types[id(opt)] = type(opt).__name__
            self._count_optimizer_bytes(opt)
            for group in opt.param_groups:
                for p in group["params"]:
                    trained.add(id(p))
        roots = []
        for m in modules:
            if id(m) in children:
                continue
            params = list(m.parameters())
            buffers = list(m.buffers())
            if not params and not buffers:
                continue
            roots.append(m)
            self.modules[id(m)] = {
                "type": type(m).__name__,
                "parameter_bytes": sum(_round(p.untyped_storage().nbytes()) for p in _unique(params)),
                "buffer_bytes": sum(_round(b.untyped_storage().nbytes()) for b in _unique(buffers)),
                "trained": any(id(p) in trained for p in params),
                "device": str(params[0].device if params else buffers[0].device)}
        self.mt.track_external(*roots, *optimizers)

    def _count_optimizer_bytes(self, opt) -> None:
        """The storages of the optimizers' parameters per device (a wrapper and the optimizer it wraps
        share theirs: each storage counted once); the largest sum seen is kept."""
        self.optimizers.add(opt)
        seen = set()
        sums: dict = {}
        for o in list(self.optimizers):
            for group in o.param_groups:
                for p in group["params"]:
                    st = p.untyped_storage()
                    key = (str(p.device), st.data_ptr(), st.nbytes())
                    if key not in seen:
                        seen.add(key)
                        sums[str(p.device)] = sums.get(str(p.device), 0) + _round(st.nbytes())
        for dev, n in sums.items():
            self.optimizer_bytes[dev] = max(self.optimizer_bytes.get(dev, 0), n)

    # -- entering and leaving -----------------------------------------------------------------------

    def enter(self, how: str) -> None:
        if self.entered is not None:
            return
        if self.enter_mode == "late":
            self.sweep()
        self.mt.__enter__()
        self.entered = {"how": how, "optimizer_steps": self.counts["optimizer_steps"],
                        "root_forwards": self.counts["root_forwards"]}

    def exit(self) -> None:
        if self.entered is not None and not self.exited:
            self.exited = True
            try:
                self.mt.__exit__(None, None, None)
            except Exception:
                traceback.print_exc()

    # -- the record ---------------------------------------------------------------------------------

    def record(self) -> dict:
        torch = self.torch
        devices: dict = {}
        peak = self.mt.get_tracker_snapshot("peak") if self.entered is not None else {}
        for dev, cats in peak.items():
            name = str(dev)
            split = {str(getattr(k, "value", k)): int(v) for k, v in cats.items()}
            row = {"peak": split, "allocated_at_peak": None, "peak_phase": None, "peak_step": None,
                   "peak_root_forwards": None, "at_allocator_peak": self.allocator_peak.get(name),
                   "optimizer_parameter_bytes": self.optimizer_bytes.get(name, 0), "max_memory_allocated": None}
            row.update(self.at_peak.get(name, {}))
            if dev.type == "cuda":
                # The peak counter is reset at each operator: its highest reading is the run's.
                row["max_memory_allocated"] = (self.allocator_peak.get(name) or {}).get("allocated")
                row["device_name"] = torch.cuda.get_device_name(dev)
            devices[name] = row
        return {"counts": {"all": dict(self.counts), "with_tracker_entered": dict(self.seen)},
                "modules": list(self.modules.values()),
                "optimizers": sorted(set(self.optimizer_types.values())),
                "devices": devices}


def _unique(tensors):
    seen = set()
    for t in tensors:
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr(), st.nbytes())
        if key not in seen:
            seen.add(key)
            yield t


def run(program: str, args: list[str], enter: str) -> tuple[int, dict]:
    import torch

    path = os.path.abspath(program)
    harness = Harness(torch, enter)
    harness.install()
    exit_code, error = 0, None
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(path)  # as `python PROGRAM` would have it
    start = time.time()
    try:
        if enter == "start":
            harness.enter("before the program's first line")
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if exit_code not in (0, None):
            error = f"SystemExit({code!r})"
    except BaseException as e:  # the program's failure, or MemTracker's: written down, passed on
        traceback.print_exc()
        exit_code, error = 1, f"{type(e).__name__}: {e}"
    finally:
        harness.exit()
        harness.uninstall()
    elapsed = time.time() - start
    out = {"program": program, "args": args, "torch": torch.__version__, "python": platform.python_version(),
           "enter": enter, "entered": harness.entered, "exit_code": exit_code, "error": error,
           "skipped": exit_code == 77, "elapsed_s": round(elapsed, 2),
           "cannot_see": CANNOT_SEE + (CANNOT_SEE_LATE if enter == "late" else [])}
    out.update(harness.record())
    return exit_code, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="PATH", help="where to write the record (else standard output)")
    p.add_argument("--enter", choices=("start", "late"), default="start",
                   help="enter MemTracker before the program starts (default), or after its first step")
    p.add_argument("program")
    p.add_argument("args", nargs=argparse.REMAINDER)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    command = shlex.join(["python", "benchmarks/memtracker_reference.py", *argv])
    code, out = run(a.program, a.args, a.enter)
    out = {"command": command, **out}
    text = json.dumps(out, indent=1, default=str)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        sys.__stdout__.write(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
