"""What the search at a pause's height costs the program, on the CPU (no GPU needed).

A real agent over the torch test double (tests/doubles/fake_cuda.py; the allocator's figures are
SYNTHETIC), in a process whose heap holds --objects Python objects: steps, then a pause whose
memory rises, sampled on a thread as the agent's own thread does. Measured: the pause the program
sees on its main thread when the search is asked of it (the roots listed and the fork, the exit
record's `cost.phase_pause_s`), the time the copy took to search, and what the pause check costs
per sample (`PhaseWatch.check`: a time sample's, and a step sample's on the program's thread). One process per repeat: a fork's pause grows with the
process's memory, so each repeat starts from the same heap.

    python benchmarks/phase_search.py --objects 200000 --repeats 5 --json out.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB, GiB = 1 << 20, 1 << 30


def one(objects: int) -> dict:
    """One measurement in this process."""
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("fake_cuda", ROOT / "tests" / "doubles" / "fake_cuda.py")
    fake_cuda = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake_cuda)
    heap = [{"id": i, "tokens": [i, i + 1]} for i in range(objects // 3)]  # about `objects` tracked objects
    run_dir = tempfile.mkdtemp()
    agent, clock = fake_cuda.make_agent(run_dir)
    agent.trace.mode = "off"  # the search at the first sample above the steps (no stacks window first)
    for _ in range(150):
        clock.now += 0.005
        agent.torch.set(GiB + 200 * MiB, 8 * GiB)
        agent.torch.set(GiB, 8 * GiB)
        agent.on_step(explicit=True)
    watch = agent.phase_watch
    started = time.perf_counter()
    for _ in range(10_000):
        watch.check(clock.now, "time")  # below the steps' level: the common case while a pause runs
    check_us = (time.perf_counter() - started) / 10_000 * 1e6
    started = time.perf_counter()
    for _ in range(10_000):
        watch.check(clock.now, "step")  # at each step sample, on the program's thread
    check_step_us = (time.perf_counter() - started) / 10_000 * 1e6
    for level in (GiB + 100 * MiB, GiB + 300 * MiB, GiB + 500 * MiB, GiB + 700 * MiB):
        clock.now += 0.02
        agent.torch.set(level, 8 * GiB)
        sampling = threading.Thread(target=agent.sampler._sample, args=("time", True), name="gpumemdoctor-agent")
        sampling.start()
        sampling.join()
        for _ in range(1000):  # the program's own code, where the asked search runs
            pass
    agent.growth_watch.wait_for_copies()
    fake_cuda.restore_clock()
    records = [json.loads(x) for x in Path(run_dir, f"agent-{agent.pid}.jsonl").read_text().splitlines()]
    search = next(r for r in records if r["type"] == "investigation" and r["when"] == "phase")
    return {"objects_visited": search["visited"], "pause_ms": agent.cost["phase_pause_s"] * 1000,
            "fork_ms": agent.cost["search_pause_max_s"] * 1000, "copy_search_s": search["elapsed_s"],
            "check_us": check_us, "check_step_us": check_step_us, "heap": len(heap)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.objects)))
        return
    runs = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, "--one", "--objects", str(args.objects)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.splitlines()[-1]))
    summary = {key: {"median": statistics.median(r[key] for r in runs), "max": max(r[key] for r in runs)}
               for key in ("pause_ms", "fork_ms", "copy_search_s", "check_us", "check_step_us",
                           "objects_visited")}
    result = {"objects": args.objects, "repeats": args.repeats, "python": sys.version.split()[0],
              "summary": summary, "runs": runs}
    for key, v in summary.items():
        print(f"{key:15s} median {v['median']:10.3f}  max {v['max']:10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
