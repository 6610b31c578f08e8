# expect: leak
# expect-holder: __main__.pending[*] -> suspended generator batches() at leak_generator_frame.py local buf
# expect-holder-kind: generator
"""Each step starts a generator that stages a 4 MiB buffer on the GPU and yields once; the program
keeps the generators "to finish later" and never resumes them. Each suspended generator's frame
keeps its local buffer."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


def batches(n):
    buf = torch.randn(1024, 1024, device="cuda")  # allocates
    yield buf[:n]
    yield buf[n:]


pending = []
for step in range(150):
    gen = batches(512)
    x = next(gen)
    pending.append(gen)  # the rest of the batch is "for later"
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    del x
    torch.cuda.synchronize()
print(f"{len(pending)} generators left suspended")
