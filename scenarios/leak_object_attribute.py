# expect: leak
# expect-holder: __main__.stats.history[*]
# expect-holder-kind: attribute
"""A metrics object that keeps each step's output tensor in an attribute: 4 MiB more per step."""
from _common import need_cuda_torch

torch = need_cuda_torch()


class Stats:
    def __init__(self):
        self.history = []  # meant for numbers; gets tensors


model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
stats = Stats()
for step in range(120):
    x = torch.randn(1024, 1024, device="cuda")
    out = model(x)
    loss = out.square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    stats.history.append(out.detach().clone())  # allocates 4 MiB a step, kept by stats.history
    torch.cuda.synchronize()
print(f"{len(stats.history)} outputs kept")
