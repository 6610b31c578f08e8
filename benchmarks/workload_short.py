"""A loop of very short steps for benchmarks/overhead.py: the worst case for per-step cost.

    python benchmarks/workload_short.py [STEPS] [--warmup N] [--layers L] [--width W] [--batch B]

A tiny MLP (two Linear(64, 64) layers, batch 32) trained with AdamW: every step is
a forward, a backward and an optimizer step, about 1.0 ms on an H200 and bound by the
CPU's kernel launches, so anything the tool does per optimizer step (its
step hook, its sampling) shows up here in full. The data lives on the GPU.

It runs --warmup steps untimed, then times STEPS steps between two
torch.cuda.synchronize() calls and prints one line on stdout:

    STEP_TIME_MS <mean milliseconds per timed step>
"""
from __future__ import annotations

import argparse
import sys
import time

DEFAULT_STEPS = 6000  # ~6 s at 1.0 ms a step on an H200
DEFAULT_WARMUP = 50


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("steps", nargs="?", type=int, default=DEFAULT_STEPS,
                        help=f"timed steps [default: {DEFAULT_STEPS}]")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                        help=f"untimed steps first [default: {DEFAULT_WARMUP}]")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error("steps must be at least 1 and --warmup at least 0")

    import torch

    if not torch.cuda.is_available():
        print("workload_short: needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2

    torch.manual_seed(0)
    device = torch.device("cuda")
    blocks = []
    for i in range(args.layers):
        blocks.append(torch.nn.Linear(args.width, args.width))
        if i < args.layers - 1:
            blocks.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*blocks).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=device)
    y = torch.randn(args.batch, args.width, device=device)

    def train_step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        train_step()
    torch.cuda.synchronize()

    start = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    print(f"STEP_TIME_MS {elapsed * 1e3 / args.steps:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
