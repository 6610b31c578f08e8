"""What the two benchmark workloads share: their command line, and timing the steady loop; and the
opening of the benchmarks that measure the agent inside their own process (`cuda_torch_here`)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from _switch import PARTS

DEFAULT_WARMUP = 50
AB_WARMUP = 300  # --ab: past the agent's every-step samples (100) and its start-up window of stacks (50)
AB_SETTLE = 20  # --ab: untimed steps after each switch


def cuda_torch_here(name: str):
    """torch with a CUDA GPU in this process, or None after printing why `name` is skipped."""
    try:
        import torch
    except ImportError:
        print(f"{name}: skipped: torch is not installed")
        return None
    if not torch.cuda.is_available():
        print(f"{name}: skipped: no CUDA GPU for torch here; nothing to measure")
        return None
    return torch


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
    p.add_argument("--ab", metavar="BLOCKSxSTEPS",
                   help="instead of one timed run, BLOCKS blocks of STEPS steps with gpumemdoctor's work "
                        "on and off by turns (on, off, off, on, ...; see _switch.py and loop_ab.py)")
    p.add_argument("--ab-parts", choices=PARTS, default="all",
                   help="with --ab: switch only the agent or only the supervisor [default: all]")
    return p


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.steps < 1 or args.warmup < 0:
        p.error("steps must be at least 1 and --warmup at least 0")
    if args.ab is not None:
        try:
            blocks, steps = (int(n) for n in args.ab.lower().split("x"))
        except ValueError:
            p.error(f"--ab {args.ab}: give BLOCKSxSTEPS, e.g. 40x500")
        if blocks < 4 or blocks % 4 or steps < 1:
            p.error(f"--ab {args.ab}: BLOCKS must be a multiple of 4 and STEPS at least 1")
        args.ab = (blocks, steps)


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


def time_steps(torch, train_step, args: argparse.Namespace) -> None:
    """Run --warmup untimed steps, time STEPS between synchronizes, print STEP_TIME_MS; or --ab."""
    if args.ab is not None:
        time_blocks(torch, train_step, *args.ab, max(args.warmup, AB_WARMUP), args.ab_parts)
        return
    steps, warmup = args.steps, args.warmup
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


def time_blocks(torch, train_step, blocks: int, steps: int, warmup: int, parts: str = "all") -> None:
    """Time `blocks` blocks of `steps` steps, the tool's work on and off by turns (ABBA order, so
    that a drift over the run falls on both sides alike). Prints `AB_SWITCH <what was found>`,
    then `AB_BLOCK <on|off> <mean ms per step>` per block and STEP_TIME_MS of the "on" blocks."""
    from _switch import ToolSwitch

    switch = ToolSwitch(torch, parts)
    print(f"AB_SWITCH {switch.describe()}", flush=True)
    phase("loop")
    i = 0
    for _ in range(warmup):
        train_step(i)
        i += 1
    on_times = []
    try:
        for block in range(blocks):
            mode = "on" if block % 4 in (0, 3) else "off"
            switch.on() if mode == "on" else switch.off()
            for _ in range(AB_SETTLE):
                train_step(i)
                i += 1
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                train_step(i)
                i += 1
            torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3 / steps
            if mode == "on":
                on_times.append(ms)
            print(f"AB_BLOCK {mode} {ms:.6f}", flush=True)
    finally:
        switch.on()  # the tool must see the end of the run
    print(f"STEP_TIME_MS {statistics.median(on_times):.6f}", flush=True)
    phase("end")
