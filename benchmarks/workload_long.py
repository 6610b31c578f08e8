"""A training loop of several minutes with a slow leak, for benchmarks/long_gpu.py.

    python benchmarks/workload_long.py [--minutes 7] [--leak-mib 1] [--leak-every-s 2]

An MLP (4 x Linear(2048, 2048), batch 256) trained with AdamW on the GPU, and a global
list that keeps a `--leak-mib` MiB tensor every `--leak-every-s` seconds (0.5 MiB a second by
default: 210 MiB over 7 minutes). Each step is timed between two synchronizes; every minute
of the loop prints

    MINUTE <n> <steps> <median step ms> <mean step ms> <p99 step ms> <allocated bytes>

so the step's cost early and late in the run can be compared under the tool, and
`PHASE <name> <wall clock>` lines as the other workloads do.
"""
from __future__ import annotations

import statistics
import sys
import time

from _loop import cuda_torch, mlp, phase

kept = []  # the leak: never cleared


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=7.0, help="how long the loop runs [default: 7]")
    p.add_argument("--leak-mib", type=float, default=1.0, help="MiB kept each time [default: 1]")
    p.add_argument("--leak-every-s", type=float, default=2.0, help="seconds between two [default: 2]")
    p.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)  # a dry run of the loop itself
    args = p.parse_args()
    if args.minutes <= 0 or args.leak_mib < 0 or args.leak_every_s <= 0:
        p.error("--minutes and --leak-every-s must be positive, --leak-mib at least 0")
    phase("start")
    if args.cpu:
        import torch

        torch.cuda.synchronize = lambda: None
        torch.cuda.memory_allocated = lambda: 0
        device = "cpu"
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
    else:
        torch = cuda_torch("workload_long")
        if torch is None:
            return 77
        device = "cuda"
        model = mlp(torch, 2048, 4, torch.nn.GELU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 2048 if device == "cuda" else 256, device=device)
    leak_elements = int(args.leak_mib * (1 << 20)) // 4

    def train_step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(20):  # warm-up: optimizer state, cuBLAS workspaces
        train_step()
    torch.cuda.synchronize()
    phase("loop")
    start = time.perf_counter()
    end = start + args.minutes * 60
    next_leak = start + args.leak_every_s
    minute, minute_end = 1, start + 60
    times: list[float] = []
    steps = 0
    while True:
        before = time.perf_counter()
        train_step()
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append((now - before) * 1e3)
        steps += 1
        if leak_elements and now >= next_leak:
            kept.append(torch.randn(leak_elements, device=device))  # allocates
            next_leak += args.leak_every_s
        if now >= minute_end or now >= end:
            ordered = sorted(times)
            print(f"MINUTE {minute} {len(times)} {statistics.median(ordered):.4f} {statistics.fmean(ordered):.4f} "
                  f"{ordered[int(len(ordered) * 0.99)]:.4f} {torch.cuda.memory_allocated()}", flush=True)
            times = []
            minute += 1
            minute_end += 60
        if now >= end:
            break
    print(f"STEPS {steps} KEPT {len(kept)}", flush=True)
    phase("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
