"""Does NVML polling stretch a CUDA program's step gaps? (issues 57 and 58)

Under `gpumemdoctor run` the supervisor asks NVML for each GPU's process list every 5 ms
(`--poll-interval`), and the agent's sampler asks it from inside the program. Both are outside the
agent's own accounting of a step gap (readings/felt.py counts the agent's Python work only). This
measures the worst and the 99th-percentile gap between the step ends of a plain CUDA loop, with
nothing else running, with another process polling NVML's process list at a rate, and with a
thread of the program's own polling it, interleaved round by round.

    python3 benchmarks/nvml_contention.py --rounds 3 --seconds 6 --json out.json

Needs a GPU, torch and nvidia-ml-py. Prints one line per run and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

LOOP = textwrap.dedent('''
    import json, os, sys, threading, time, torch
    workload, seconds, inner, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    if inner > 0:  # a thread of the program's own asks NVML for the process list, as the agent's sampler
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        def poll():
            while True:
                pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                time.sleep(inner)
        threading.Thread(target=poll, daemon=True).start()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ends = []
    t_end = None
    while True:
        x = torch.randn(512, 1024, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if workload == "sleepy":  # the attach test's shape: 1 GiB freed each step, a 5 ms sleep
            scratch = torch.empty(256 << 20, device="cuda")
            del scratch
            torch.cuda.synchronize()
            ends.append(time.monotonic())
            time.sleep(0.005)
        else:  # busy: a loss read each step, no sleep
            model(x).sum().item()
            ends.append(time.monotonic())
        if t_end is None and len(ends) == 20:
            t_end = time.monotonic() + seconds  # (after a warm-up)
        if t_end is not None and ends[-1] >= t_end:
            break
    ends = ends[20:]
    gaps = sorted(b - a for a, b in zip(ends, ends[1:]))
    json.dump({"steps": len(ends), "worst": gaps[-1], "p99": gaps[int(0.99 * (len(gaps) - 1))],
               "median": gaps[len(gaps) // 2]}, open(out, "w"))
''')

POLLER = textwrap.dedent('''
    import sys, time, pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    interval = float(sys.argv[1])
    while True:
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
        time.sleep(interval)
''')

CONDITIONS = {"plain": (0.0, 0.0), "outside_5ms": (0.005, 0.0), "outside_1ms": (0.001, 0.0),
              "outside_20ms": (0.02, 0.0), "outside_50ms": (0.05, 0.0), "inside_20ms": (0.0, 0.02)}


def one(workload: str, condition: str, seconds: float, folder: str) -> dict:
    outside, inside = CONDITIONS[condition]
    loop = os.path.join(folder, "loop.py")
    poller_file = os.path.join(folder, "poller.py")
    out = os.path.join(folder, "row.json")
    with open(loop, "w") as f:
        f.write(LOOP)
    with open(poller_file, "w") as f:
        f.write(POLLER)
    poller = subprocess.Popen([sys.executable, poller_file, str(outside)]) if outside > 0 else None
    try:
        subprocess.run([sys.executable, loop, workload, str(seconds), str(inside), out], check=True, timeout=300)
    finally:
        if poller is not None:
            poller.kill()
            poller.wait()
    with open(out) as f:
        row = json.load(f)
    row.update(workload=workload, condition=condition)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--workloads", default="sleepy,busy")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for workload in args.workloads.split(","):
                for condition in args.conditions.split(","):
                    row = one(workload, condition, args.seconds, folder)
                    row["round"] = r
                    rows.append(row)
                    print(f"round {r} {workload:7s} {condition:12s} steps {row['steps']:5d} worst "
                          f"{row['worst'] * 1e3:7.2f} ms  p99 {row['p99'] * 1e3:6.2f}  median "
                          f"{row['median'] * 1e3:6.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
