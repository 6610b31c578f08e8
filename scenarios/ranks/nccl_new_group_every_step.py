# expect: non-torch
# expect-finding: non-torch
# expect-nccl-growth: yes
# launch: 2
# needs-gpus: 2
"""Two ranks on NCCL that make a new process group at every step and all-reduce on it, never
destroying one: each group's NCCL communicator keeps its buffers, outside PyTorch's allocator, so
that memory keeps growing; the finding names the process groups, from 1 to 41."""
import torch.distributed as dist

from _ddp import init, need_cuda_torch, rank_and_device

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
weight = torch.nn.Parameter(torch.ones(1 << 20, device=device))
opt = torch.optim.SGD([weight], lr=1e-3)  # its steps are the loop's steps
for i in range(40):
    group = dist.new_group([0, 1])  # the mistake: a new group (and NCCL communicator) every step
    grad = torch.ones_like(weight)
    dist.all_reduce(grad, group=group)
    weight.grad = grad
    opt.step()
torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
