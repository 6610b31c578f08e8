# expect: leak
# expect-holder: __main__.prefetched[*]
# expect-holder-kind: global
# expect-thread: loader-
"""Batches prefetched by short-lived loader threads into a dict that nobody clears: each
thread ends, its 4 MiB batch stays."""
import threading

from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
prefetched = {}


def load(step):
    prefetched[step] = torch.randn(1024, 1024, device="cuda")  # allocates 4 MiB in the thread


for step in range(120):
    loader = threading.Thread(target=load, args=(step,), name=f"loader-{step}")
    loader.start()
    loader.join()
    loss = model(prefetched[step][:256]).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
print(f"{len(prefetched)} batches never dropped")
