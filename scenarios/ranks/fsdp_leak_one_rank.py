# expect: leak
# expect-leak-ranks: 1
# launch: 2
# needs-gpus: 2
"""A two-rank FSDP loop where only rank 1 keeps each step's output (4 MiB, with its autograd
graph's saved tensors freed by backward): a leak on rank 1, rank 0 clean."""
from _ddp import finish, init, need_cuda_torch, rank_and_device
from _fsdp import fsdp_step, sharded_model_and_optimizer

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
model, opt = sharded_model_and_optimizer(torch, device)
kept = []
for i in range(200):
    out = fsdp_step(torch, model, opt, device)
    if rank == 1:
        kept.append(out.detach())  # kept on this rank only
finish(torch)
