"""What the two benchmark workloads share: their command line, and timing the steady loop."""
from __future__ import annotations

import argparse
import sys
import time

DEFAULT_WARMUP = 50


def phase(name: str) -> None:
    """`PHASE <name> <wall clock>` on stdout: overhead.py splits a run's wall time with these."""
    print(f"PHASE {name} {time.time():.6f}", flush=True)


def parser(doc: str, default_steps: int) -> argparse.ArgumentParser:
    """STEPS and --warmup; the workload adds its own options."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("steps", nargs="?", type=int, default=default_steps,
                   help=f"timed steps [default: {default_steps}]")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed steps first [default: {DEFAULT_WARMUP}]")
    return p


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.steps < 1 or args.warmup < 0:
        p.error("steps must be at least 1 and --warmup at least 0")


def cuda_torch(name: str):
    """torch, or None after saying why the workload cannot run."""
    import torch

    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return None
    return torch


def mlp(torch, width: int, layers: int, activation):
    """`layers` Linear(width, width) on the GPU, with `activation` between them."""
    blocks = []
    for i in range(layers):
        blocks.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            blocks.append(activation())
    return torch.nn.Sequential(*blocks).to(torch.device("cuda"))


def time_steps(torch, train_step, steps: int, warmup: int) -> None:
    """Run `warmup` untimed steps, time `steps` between synchronizes, print STEP_TIME_MS."""
    phase("loop")
    for i in range(warmup):
        train_step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        train_step(i)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(f"STEP_TIME_MS {elapsed * 1e3 / steps:.6f}", flush=True)
    phase("end")
