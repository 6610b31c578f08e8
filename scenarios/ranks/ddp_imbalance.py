# expect: clean
# expect-finding: rank-imbalance
# expect-imbalance-rank: 0
# launch: 2
"""Two-rank DDP where rank 0 also holds an evaluation buffer of 3 GiB that the other rank
never allocates: no leak, but rank 0's peak is well above rank 1's."""
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, step

torch = need_cuda_torch()
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device)
model, opt = model_and_optimizer(torch, device)
eval_buffer = torch.empty(3 << 30, dtype=torch.uint8, device=device) if rank == 0 else None
for i in range(300):
    step(torch, model, opt, device)
del eval_buffer
finish(torch)
