# expect: leak
# expect-holder: __main__.ema_history[*]
"""An exponential moving average kept as a new `copy.deepcopy(model)` at every step, and every copy
kept: 12 MiB a step. The allocating line is the program's own `deepcopy` call, not copy.py's."""
import copy

from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(2048, 1536, bias=False).cuda()  # 12 MiB of weights
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
ema_history = []
for step in range(150):
    loss = model(torch.randn(256, 2048, device="cuda")).square().mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    ema_history.append(copy.deepcopy(model))  # allocates
    torch.cuda.synchronize()
print(f"kept {len(ema_history)} copies")
