"""What `gpumemdoctor run` adds to a program that only starts CUDA (issue 40, item 7: "a 4 s program
that only starts CUDA +0.3 s"), and where that time goes.

    python benchmarks/cuda_start.py [--pairs 6] [--json PATH]

The program (written to a temporary folder) imports torch, makes one tensor on the GPU, synchronizes
and ends, printing the wall-clock time (time.time()) after each of those. It runs plainly (`python
prog.py`) and under the tool (`python -m gpumemdoctor run -o R.json prog.py`, the terminal report
written to a file, as a user would see it), alternating plain and tool, --pairs times. Each run's
wall time, from this script's launch of the command to its exit, is split at the program's own
marks:

    start    launch -> torch imported, in two:
      launch   launch -> the program's first line   (interpreter, site, the tool's CLI to the
               target's launch, and the target's interpreter with the agent's start)
      import   the program's first line -> torch imported   (torch's import, with the agent's hook)
    cuda     torch imported -> first tensor on the GPU, synchronized   (CUDA's start: the agent's
             hooks at its start are here)
    end      the program's last line -> the command's exit   (the agent's exit probes, and the
             tool's diagnosis, report and terminal output)

and, for the tool's runs, the agent's own exit costs from the report (`exit_*_s`). Printed: every
run, then the medians of each part, plain and tool, and the median of the pairs' differences.
Needs a GPU; a run that fails stops the benchmark with its error.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = """\
import time
print("MARK start", time.time(), flush=True)
import torch
print("MARK imported", time.time(), flush=True)
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
print("MARK cuda", time.time(), flush=True)
del x
print("MARK end", time.time(), flush=True)
"""
PARTS = ("start", "launch", "import", "cuda", "end")


def one(cmd: list, cwd: Path) -> dict:
    launched = time.time()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    exited = time.time()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    marks = {}
    for line in done.stdout.splitlines():
        if line.startswith("MARK "):
            _, name, t = line.split()
            marks[name] = float(t)
    return {"wall_s": exited - launched, "start": marks["imported"] - launched,
            "launch": marks["start"] - launched, "import": marks["imported"] - marks["start"],
            "cuda": marks["cuda"] - marks["imported"], "end": exited - marks["end"]}


def agent_exit_costs(report_path: Path) -> dict:
    report = json.loads(report_path.read_text())
    target = report["target"]["pid"]
    for agent in report["recording"]["agents"]:
        if agent["pid"] == target:
            cost = (agent.get("exit_info") or {}).get("cost") or {}
            costs = {k: v for k, v in cost.items() if k.startswith("exit_") or k == "init_s"}
            before = (report["recording"].get("tool_cost") or {}).get("before_target_s")
            if before is not None:  # the CLI's own start, to the target's launch
                costs["cli_before_target_s"] = before
            return costs
    return {}


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--json", metavar="PATH", help="write every run's numbers here")
    a = p.parse_args(argv)
    runs: list = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "prog.py").write_text(PROGRAM)
        for pair in range(a.pairs):
            report = folder / f"r{pair}.json"
            plain = one([sys.executable, "prog.py"], folder)
            tool = one([sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report), "prog.py"], folder)
            tool["agent"] = agent_exit_costs(report)
            runs += [{"mode": "plain", "pair": pair, **plain}, {"mode": "tool", "pair": pair, **tool}]
            print(f"pair {pair}: plain {plain['wall_s']:.2f} s, tool {tool['wall_s']:.2f} s "
                  f"({', '.join(f'{k} {tool[k] - plain[k]:+.2f}' for k in PARTS)}); "
                  f"agent at exit {sum(v for k, v in tool['agent'].items() if k.startswith('exit_')):.3f} s, "
                  f"CLI to the launch {tool['agent'].get('cli_before_target_s', float('nan')):.2f} s", flush=True)
    print()
    header = "pairs' median difference"
    print(f"{'part':8} {'plain s':>8} {'tool s':>8} {header:>26}")
    for key in ("wall_s",) + PARTS:
        plain = [r[key] for r in runs if r["mode"] == "plain"]
        tool = [r[key] for r in runs if r["mode"] == "tool"]
        diff = [t - q for t, q in zip(tool, plain)]
        print(f"{key:8} {statistics.median(plain):8.3f} {statistics.median(tool):8.3f} {statistics.median(diff):+26.3f}")
    exits = [r["agent"] for r in runs if r["mode"] == "tool"]
    keys = sorted({k for e in exits for k in e})
    print("the agent's own costs (median s): " + ", ".join(
        f"{k} {statistics.median(e.get(k, 0.0) for e in exits):.4f}" for k in keys))
    if a.json:
        meta = {"argv": sys.argv, "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "cwd": os.getcwd()}
        Path(a.json).write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
