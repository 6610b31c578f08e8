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

import sys

from _loop import check, cuda_torch, phase, mlp, parser, time_steps

DEFAULT_STEPS = 6000  # ~6 s at 1.0 ms a step on an H200


def main() -> int:
    phase("start")
    p = parser(__doc__, DEFAULT_STEPS)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    check(p, args)
    torch = cuda_torch("workload_short")
    if torch is None:
        return 2

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = mlp(torch, args.width, args.layers, torch.nn.ReLU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=device)
    y = torch.randn(args.batch, args.width, device=device)

    def train_step(_: int) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    time_steps(torch, train_step, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
