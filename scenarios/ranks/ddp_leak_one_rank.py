# expect: leak
# expect-leak-ranks: 1
# launch: 2
"""Two-rank DDP where only rank 1 keeps each step's loss with its autograd graph (a metric
list kept on that rank alone): a leak on rank 1, rank 0 clean."""
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, step

torch = need_cuda_torch()
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device)
model, opt = model_and_optimizer(torch, device)
history = []
for i in range(300):
    loss = step(torch, model, opt, device)
    if rank == 1:
        history.append(torch.empty(1 << 20, device=device))  # allocates 4 MiB a step, kept
finish(torch)
