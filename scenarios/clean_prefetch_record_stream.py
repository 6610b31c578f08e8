# expect: clean
"""A side-stream prefetcher: each batch (64 MiB) is copied to the GPU on a side stream, used on the
default stream, marked with record_stream and dropped. The allocator keeps such a block as active
until it next allocates and sees the event done, so the program ends with several batches counted
`active` though their work finished long before: cache a moment late, not memory held for a stream."""
from _common import need_cuda_torch

torch = need_cuda_torch()
side = torch.cuda.Stream()
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
host = torch.randn(4096, 4096).pin_memory()  # one batch, 64 MiB


def prefetch():
    with torch.cuda.stream(side):
        return host.to("cuda", non_blocking=True)


ahead = [prefetch() for _ in range(4)]
for step in range(200):
    torch.cuda.current_stream().wait_stream(side)
    x = ahead.pop(0)
    x.record_stream(torch.cuda.current_stream())
    ahead.append(prefetch())
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    del x
    if step % 50 == 0:
        print(f"step {step} loss {loss.item():.4f}")
torch.cuda.current_stream().wait_stream(side)
for x in ahead:
    x.record_stream(torch.cuda.current_stream())
del ahead, x
torch.cuda.synchronize()
print("done")
