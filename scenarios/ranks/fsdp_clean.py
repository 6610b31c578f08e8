# expect: clean
# launch: 2
# needs-gpus: 2
"""A clean two-rank FSDP loop on NCCL, one GPU per rank: every step gathers each layer's shards
and reduce-scatters its gradients; nothing is kept from one step to the next."""
from _ddp import finish, init, need_cuda_torch, rank_and_device
from _fsdp import fsdp_step, sharded_model_and_optimizer

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
model, opt = sharded_model_and_optimizer(torch, device)
for i in range(200):
    fsdp_step(torch, model, opt, device)
finish(torch)
