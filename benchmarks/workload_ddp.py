"""A data-parallel training loop for benchmarks/overhead.py: the realistic MLP under DDP.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/workload_ddp.py [STEPS]
        [--warmup N] [--hidden H] [--layers L] [--batch B]

Each rank trains four Linear(4096, 4096) layers (bf16 autocast, AdamW) wrapped in
DistributedDataParallel, so every step ends in an all-reduce of the gradients. With a GPU per
rank the backend is NCCL; where the ranks must share GPUs (one GPU, two ranks) it is gloo, which
copies the gradients through the host. Rank 0 prints the slowest rank's mean step, and the longest
single step of any rank, timed on the host between step starts (no synchronize in the loop: what
the host waits for, the tool's pauses included, but not a GPU-side figure):

    STEP_TIME_MS <milliseconds per timed step, the maximum over ranks>
    WORST_STEP_MS <the longest step, the maximum over ranks>

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 unless already set).
"""
from __future__ import annotations

import os
import sys
import time

from _loop import check, cuda_torch, mlp, parser, phase

DEFAULT_STEPS = 1500
N_BATCHES = 4


def main() -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        phase("start")
    p = parser(__doc__, DEFAULT_STEPS)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    check(p, args)
    torch = cuda_torch("workload_ddp")
    if torch is None:
        return 2
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count()
    device = torch.device("cuda", local_rank % gpus)
    torch.cuda.set_device(device)
    backend = "nccl" if gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", world)) else "gloo"
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        mlp(torch, args.hidden, args.layers, torch.nn.GELU).to(device), device_ids=[device.index])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    inputs = [torch.randn(args.batch, args.hidden, device=device) for _ in range(N_BATCHES)]
    targets = [torch.randn(args.batch, args.hidden, device=device) for _ in range(N_BATCHES)]

    def train_step(i: int) -> None:
        x, y = inputs[i % N_BATCHES], targets[i % N_BATCHES]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if rank == 0:
        phase("loop")
    for i in range(args.warmup):
        train_step(i)
    torch.cuda.synchronize()
    dist.barrier()
    start = last = time.perf_counter()
    worst = 0.0
    for i in range(args.steps):
        train_step(i)
        now = time.perf_counter()
        worst = max(worst, now - last)
        last = now
    torch.cuda.synchronize()
    per_step = torch.tensor([(time.perf_counter() - start) * 1e3 / args.steps, worst * 1e3], device=device)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"STEP_TIME_MS {per_step[0].item():.6f}", flush=True)
        print(f"WORST_STEP_MS {per_step[1].item():.6f}", flush=True)
        phase("end")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
