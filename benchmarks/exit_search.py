"""The exit search of a real program, phase by phase and function by function.

    python benchmarks/exit_search.py corpus/timm_resnet50_ema.py [--repeats 7] [--profile 20] [--json PATH]

Runs the corpus workload in this process's own `__main__` (as `python SCRIPT` would, so its
globals are the module globals the search starts from), then, where it ended, makes the search
that the agent makes at exit of a run without growth (every live block, with the `live` budget
for a run this long) `--repeats` times: the median and the range of its whole time and of each
phase (the allocator's snapshot, the anchors' heap pass, the sweep, the autograd graphs, the
climb), the heap's objects and the tensors, and then one more search under cProfile, its
`--profile` most costly functions by their own time. The tool is not running: only its search
module is used. Allocation stacks are recorded from the start (as with --trace on; --no-stacks:
none), so every block has the stack the search groups it by.
Needs torch with a CUDA GPU (the blocks come from PyTorch's allocator snapshot); elsewhere it
prints why it is skipped and exits 0.
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from _loop import cuda_torch_here  # noqa: E402

PHASES = ("snapshot_s", "anchors_s", "sweep_s", "graphs_s", "climb_s")


def run_workload(script: str) -> None:
    """The script, run in this process's __main__ with its own folder first on sys.path."""
    import __main__

    path = os.path.abspath(script)
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), path, "exec")
    __main__.__dict__["__file__"] = path
    exec(code, __main__.__dict__)


def searches(torch, repeats: int, profile: int, ran_s: float) -> dict:
    from gpumemdoctor._agent.search.blocks import TensorKind
    from gpumemdoctor._agent.search.search import Roots, investigate
    from gpumemdoctor._agent.growth_watch import budget_for

    kind = TensorKind(torch)
    budget_s = budget_for("live", ran_s)  # the agent's, for a run this long
    own = {threading.get_ident()}

    def once() -> dict:
        return investigate(torch, kind, {"blocks": {}, "storages": set()}, budget_s, Roots(own), {}, all_live=True)

    gc.disable()  # as the agent holds it off during its exit search
    once()  # the first one imports and warms what the agent has ready at exit
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = once()
        runs.append({"wall_s": time.perf_counter() - started, "snapshot_s": result["snapshot_s"],
                     **{k: v for k, v in result["phases"].items() if k.endswith("_s")}})
    out = {"heap_objects": result["visited"], "tensors": result["tensors"], "blocks": result["candidate_count"],
           "complete": result["complete"], "gave_up": result["gave_up"], "budget_s": budget_s}
    for key in ("wall_s", *PHASES):
        values = [r.get(key, 0.0) for r in runs]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        once()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(profile)
        out["profile"] = text.getvalue()
    gc.enable()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("script", help="a corpus workload (or any script that trains on CUDA)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--profile", type=int, default=20, help="functions listed from one profiled search (0: none)")
    p.add_argument("--no-stacks", action="store_true", help="record no allocation stacks")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    torch = cuda_torch_here("exit_search")
    if torch is None:
        return
    script = args.script
    started = time.perf_counter()
    if not args.no_stacks:
        from gpumemdoctor._agent.readings.trace import TRACE_MAX_ENTRIES

        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=TRACE_MAX_ENTRIES)
    run_workload(script)
    if not args.no_stacks:
        torch.cuda.memory._record_memory_history(enabled=None)
    ran_s = time.perf_counter() - started
    figures = searches(torch, args.repeats, args.profile, ran_s)
    meta = {"script": script, "ran_s": round(ran_s, 2), "python": platform.python_version(),
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "repeats": args.repeats, "stacks": not args.no_stacks}
    print(f"# {meta['device']} (torch {meta['torch']}, Python {meta['python']}), {script} ran {ran_s:.1f} s")
    print(f"heap {figures['heap_objects']:,} objects, {figures['tensors']} tensors, {figures['blocks']} blocks, "
          f"complete {figures['complete']}, gave up: {figures['gave_up']}")
    for key in ("wall_s", *PHASES):
        f = figures[key]
        print(f"  {key:<11} median {f['median'] * 1000:7.1f} ms  ({f['min'] * 1000:.1f}-{f['max'] * 1000:.1f})")
    if figures.get("profile"):
        print(figures["profile"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, **figures}, f, indent=1)


if __name__ == "__main__":
    main()
