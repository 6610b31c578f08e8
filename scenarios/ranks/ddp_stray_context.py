# expect: stray-context
# expect-finding: stray-context
# expect-stray: rank 1 on GPU 0
# launch: 2
"""Two-rank DDP, one GPU each, where every rank calls torch.cuda.synchronize() before
torch.cuda.set_device(local_rank): rank 1 creates a CUDA context on GPU 0 it never uses."""
import os

from _ddp import finish, init, model_and_optimizer, need_cuda_torch, step

torch = need_cuda_torch(gpus=2)
torch.cuda.synchronize()  # too early: the current device is still GPU 0 on every rank
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
init(torch, world, device)
model, opt = model_and_optimizer(torch, device)
for i in range(200):
    step(torch, model, opt, device)
finish(torch)
