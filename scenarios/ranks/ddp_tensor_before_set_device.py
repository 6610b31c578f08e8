# expect: stray-context
# expect-finding: stray-context
# expect-stray: rank 1 on GPU 0
# launch: 2
# needs-gpus: 2
"""Two-rank DDP, one GPU each, where every rank makes a small CUDA tensor before
torch.cuda.set_device(local_rank): rank 1's lands on GPU 0, where it then holds a whole CUDA context
for 2 MiB of PyTorch's memory, on rank 0's GPU."""
import os

from _ddp import finish, init, model_and_optimizer, need_cuda_torch, step

torch = need_cuda_torch(gpus=2)
seed = torch.ones(16, device="cuda")  # too early: "cuda" is GPU 0 on every rank until set_device
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
init(torch, world, device, backend="nccl")
model, opt = model_and_optimizer(torch, device)
for i in range(200):
    step(torch, model, opt, device)
finish(torch)
