# expect: clean
# launch: 2
"""A clean two-rank DDP training loop: every rank sets its device first, then trains."""
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, step

torch = need_cuda_torch()
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device)
model, opt = model_and_optimizer(torch, device)
for i in range(300):
    loss = step(torch, model, opt, device)
    if i % 100 == 0 and rank == 0:
        print(f"step {i} loss {loss.item():.4f}")
finish(torch)
