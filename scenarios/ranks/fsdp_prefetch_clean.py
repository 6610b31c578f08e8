# expect: clean
# launch: 2
# needs-gpus: 2
"""FSDP with a prefetcher on a side stream: each rank's batches (32 MiB) are copied to its GPU on a
side stream ahead of use and released with record_stream, while FSDP frees its own buffers the same
way on its streams. Both leave blocks counted `active` whose work had finished; nothing is kept:
clean on every rank, and each part told apart."""
from _ddp import finish, init, need_cuda_torch, rank_and_device
from _fsdp import sharded_model_and_optimizer

torch = need_cuda_torch(gpus=2)
rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
model, opt = sharded_model_and_optimizer(torch, device)
side = torch.cuda.Stream(device=device)
host = torch.randn(8192, 1024).pin_memory()


def prefetch():
    with torch.cuda.stream(side):
        return host.to(device, non_blocking=True)


ahead = [prefetch() for _ in range(3)]
for i in range(150):
    torch.cuda.current_stream().wait_stream(side)
    x = ahead.pop(0)
    x.record_stream(torch.cuda.current_stream())
    ahead.append(prefetch())
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    del x
torch.cuda.current_stream().wait_stream(side)
for x in ahead:
    x.record_stream(torch.cuda.current_stream())
del ahead, x
finish(torch)
