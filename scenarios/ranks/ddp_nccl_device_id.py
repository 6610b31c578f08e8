# expect: clean
# launch: 2
# needs-gpus: 2
"""A clean two-rank DDP loop whose NCCL communicator is made eagerly, inside
`init_process_group(device_id=...)` (PyTorch's recommended form), before the program's first
allocation: NCCL's memory comes before any reading the program's allocations would prompt. The
agent reads the context inside that call, before NCCL sets up, so NCCL's memory is a figure of its
own (not hidden in a context of about 980 MiB on an H100)."""
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, train

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl", eager=True)
model, opt = model_and_optimizer(torch, device)
train(torch, rank, model, opt, device)
finish(torch)
