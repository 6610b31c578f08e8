"""What the search at a pause's height costs the program, on the CPU (no GPU needed).

A real agent over the torch test double (tests/doubles/fake_cuda.py; the allocator's figures are
SYNTHETIC), in a process whose heap holds --objects Python objects: steps, then a pause whose
memory rises, sampled on a thread as the agent's own thread does. Measured: the pause the program
sees on its main thread when the search is asked of it (the roots listed and the fork, the exit
record's `cost.phase_pause_s`), the time the copy took to search, and what the pause check costs
per sample (`PhaseWatch.check`: a time sample's, and a step sample's on the program's thread). One process per repeat: a fork's pause grows with the
process's memory, so each repeat starts from the same heap.

The program's pause is split (issue 31): `fork_ms` is os.fork alone, `prep_ms` the rest (the work on
its thread before the fork). `--modules N` adds N modules to sys.modules, as a real program's imports
do (a Lightning or Hugging Face program has 3000-6000; 1 in 20 here is the program's own, with a file
outside the libraries' folders), and `--threads K` K threads waiting in a few frames each (loaders,
pin-memory threads). `--package-root` measures another checkout of the package (the code before a
change: `mkdir /tmp/before; git archive <commit> gpumemdoctor | tar -x -C /tmp/before`), with this script.

    python benchmarks/phase_search.py --objects 200000 --repeats 5 --json out.json
    python benchmarks/phase_search.py --objects 200000 --modules 4000 --threads 4 --package-root /tmp/before
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


def add_modules(n: int) -> None:
    """n modules in sys.modules, as a program's imports leave them: most a library's (a file under
    site-packages), one in 20 the program's own, each with a few globals."""
    import sysconfig
    import types

    site = sysconfig.get_paths()["purelib"]
    for i in range(n):
        name = f"_bench_mod_{i}"
        module = types.ModuleType(name)
        module.__file__ = (f"/srv/program/pkg/{name}.py" if i % 20 == 0 else f"{site}/benchpkg{i // 50}/{name}.py")
        module.CONFIG = {"i": [i]}
        module.helper = lambda x: x
        module.TABLE = list(range(4))
        sys.modules[name] = module


def add_threads(k: int) -> None:
    """k threads waiting a few frames deep, with locals (a loader's, a pin-memory thread's)."""
    import threading

    stop = threading.Event()

    def deep(n, batch):
        local = [batch, n]  # noqa: F841
        return deep(n - 1, batch) if n else stop.wait()

    for i in range(k):
        threading.Thread(target=deep, args=(6, [i] * 8), name=f"loader-{i}", daemon=True).start()


def one(objects: int, modules: int = 0, threads: int = 0, package_root: Path = ROOT) -> dict:
    """One measurement in this process."""
    sys.path.insert(0, str(package_root))
    spec = importlib.util.spec_from_file_location("fake_cuda", ROOT / "tests" / "doubles" / "fake_cuda.py")
    fake_cuda = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake_cuda)
    import gpumemdoctor

    assert str(Path(gpumemdoctor.__file__).resolve()).startswith(str(package_root.resolve())), gpumemdoctor.__file__
    add_modules(modules)
    add_threads(threads)
    heap = [{"id": i, "tokens": [i, i + 1]} for i in range(objects // 3)]  # about `objects` tracked objects
    run_dir = tempfile.mkdtemp()
    agent, clock = fake_cuda.make_agent(run_dir)
    agent.trace.mode = "off"  # the search at the first sample above the steps (no stacks window first)
    for _ in range(150):
        clock.now += 0.005
        agent.shared.torch.set(GiB + 200 * MiB, 8 * GiB)
        agent.shared.torch.set(GiB, 8 * GiB)
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
        agent.shared.torch.set(level, 8 * GiB)
        sampling = threading.Thread(target=agent.sampler._sample, args=("time", True), name="gpumemdoctor-agent")
        sampling.start()
        sampling.join()
        for _ in range(1000):  # the program's own code, where the asked search runs
            pass
    agent.growth_watch.wait_for_copies()
    fake_cuda.restore_clock()
    records = [json.loads(x) for x in Path(run_dir, f"agent-{agent.shared.pid}.jsonl").read_text().splitlines()]
    search = next(r for r in records if r["type"] == "investigation" and r["when"] == "phase")
    from gpumemdoctor._agent.search import forked

    cost = agent.shared.cost
    # Before issue 31 search_pause_max_s was the fork alone; since, the whole pause (search_fork_max_s the fork)
    fork_ms = cost.get("search_fork_max_s", cost["search_pause_max_s"]) * 1000
    pause_ms = cost["phase_pause_s"] * 1000
    return {"objects_visited": search["visited"], "pause_ms": pause_ms, "fork_ms": fork_ms,
            "prep_ms": pause_ms - fork_ms, "search_pause_max_ms": cost["search_pause_max_s"] * 1000,
            "copy_search_s": search["elapsed_s"], "check_us": check_us, "check_step_us": check_step_us,
            "heap": len(heap), "sys_modules": len(sys.modules), "private_mib": forked.private_bytes() / MiB,
            # the estimate's figure after this fork (issue 31: calibrated by each fork); absent before
            "per_gib_ms_after": forked.pause_s_per_gib() * 1000 if hasattr(forked, "pause_s_per_gib") else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modules", type=int, default=0, help="modules added to sys.modules")
    parser.add_argument("--threads", type=int, default=0, help="threads waiting a few frames deep")
    parser.add_argument("--package-root", type=Path, default=ROOT,
                        help="the checkout whose gpumemdoctor is measured (default: this one)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.objects, args.modules, args.threads, args.package_root)))
        return
    runs = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, "--one", "--objects", str(args.objects), "--modules",
                              str(args.modules), "--threads", str(args.threads), "--package-root",
                              str(args.package_root)], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.splitlines()[-1]))
    summary = {key: {"median": statistics.median(r[key] for r in runs), "max": max(r[key] for r in runs)}
               for key in ("pause_ms", "prep_ms", "fork_ms", "search_pause_max_ms", "copy_search_s", "check_us",
                           "check_step_us", "objects_visited", "sys_modules", "private_mib")}
    result = {"command": " ".join(["python", "benchmarks/phase_search.py", *sys.argv[1:]]),
              "objects": args.objects, "modules": args.modules, "threads": args.threads,
              "package_root": str(args.package_root), "repeats": args.repeats, "python": sys.version.split()[0],
              "summary": summary, "runs": runs}
    for key, v in summary.items():
        print(f"{key:15s} median {v['median']:10.3f}  max {v['max']:10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
