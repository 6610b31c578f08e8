# expect: clean
# launch: 2
"""A clean two-rank DDP training loop: every rank sets its device first, then trains (NCCL, its
communicator made at init_process_group, where each rank has a GPU; gloo where they share one)."""
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, train

torch = need_cuda_torch()
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device)
model, opt = model_and_optimizer(torch, device)
train(torch, rank, model, opt, device)
finish(torch)
