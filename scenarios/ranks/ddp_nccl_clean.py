# expect: clean
# launch: 2
# needs-gpus: 2
"""A clean two-rank DDP loop on NCCL, one GPU per rank: NCCL's communicators hold a few hundred MiB
outside PyTorch's allocator from their first collectives on (588 MiB per rank on two H100s), which
the report names as NCCL's and does not call a leak or non-torch memory."""
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, step

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
model, opt = model_and_optimizer(torch, device)
for i in range(300):
    loss = step(torch, model, opt, device)
    if i % 100 == 0 and rank == 0:
        print(f"step {i} loss {loss.item():.4f}")
finish(torch)
