"""A realistic training loop for benchmarks/overhead.py: an MLP with AdamW on one GPU.

    python benchmarks/workload_realistic.py [STEPS] [--warmup N] [--hidden H]
        [--layers L] [--batch B] [--dtype bf16|fp32] [--log-every K]

Four Linear(4096, 4096) layers with GELU between them, batch 512, bf16 autocast,
MSE loss, AdamW (PyTorch's default foreach implementation): about 2-3 ms a step on
an H100/H200, mostly matmuls and the optimizer's passes over 67M fp32 parameters.
The data lives on the GPU (a few batches, cycled) so the loop measures compute.
Every --log-every steps the loop reads the loss back with .item(), as a training
loop that logs does; that synchronises with the GPU now and then.

It runs --warmup steps untimed, then times STEPS steps between two
torch.cuda.synchronize() calls and prints one line on stdout:

    STEP_TIME_MS <mean milliseconds per timed step>
"""
from __future__ import annotations

import sys

from _loop import check, cuda_torch, phase, mlp, parser, time_steps

DEFAULT_STEPS = 2500  # ~6 s at 2.4 ms a step on an H200
N_BATCHES = 4


def main() -> int:
    phase("start")
    p = parser(__doc__, DEFAULT_STEPS)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: autocast to bfloat16; fp32: plain float32")
    p.add_argument("--log-every", type=int, default=100,
                   help="read the loss back every K steps (0: never) [default: 100]")
    args = p.parse_args()
    check(p, args)
    torch = cuda_torch("workload_realistic")
    if torch is None:
        return 2

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = mlp(torch, args.hidden, args.layers, torch.nn.GELU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    inputs = [torch.randn(args.batch, args.hidden, device=device) for _ in range(N_BATCHES)]
    targets = [torch.randn(args.batch, args.hidden, device=device) for _ in range(N_BATCHES)]
    use_autocast = args.dtype == "bf16"
    logged = []

    def train_step(i: int) -> None:
        x, y = inputs[i % N_BATCHES], targets[i % N_BATCHES]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.log_every and (i + 1) % args.log_every == 0:
            logged.append(loss.item())

    time_steps(torch, train_step, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
