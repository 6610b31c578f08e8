# expect: clean
# launch: 2
# needs-gpus: 2
"""A clean two-rank DDP loop with `gradient_as_bucket_view=True`: the gradients are views into DDP's
communication buckets, which live as long as the model. Nothing is kept: clean on every rank."""
from _ddp import finish, init, need_cuda_torch, rank_and_device, step

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                            torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index], gradient_as_bucket_view=True)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for i in range(300):
    loss = step(torch, model, opt, device)
    if i % 100 == 0 and rank == 0:
        print(f"step {i} loss {loss.item():.4f}")
finish(torch)
