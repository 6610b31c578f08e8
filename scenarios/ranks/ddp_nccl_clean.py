# expect: clean
# launch: 2
# needs-gpus: 2
"""A clean two-rank DDP loop on NCCL whose communicator is made lazily, at DDP's first broadcast
(no device_id), with NCCL's buffers set to 2 MiB (NCCL_BUFFSIZE): NCCL's memory, outside PyTorch's
allocator from its first collectives on (588 MiB per rank with the defaults on two H100s), is named
NCCL's with that variable, not called a leak or non-torch memory."""
import os

os.environ.setdefault("NCCL_BUFFSIZE", str(2 << 20))  # before NCCL reads it, at its first communicator
from _ddp import finish, init, model_and_optimizer, need_cuda_torch, rank_and_device, train  # noqa: E402

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl", eager=False)
model, opt = model_and_optimizer(torch, device)
train(torch, rank, model, opt, device)
finish(torch)
