# expect: clean
"""A steady sawtooth: outputs are buffered for 10 steps, then summarised and dropped.

Each step keeps its detached output (512 x 4096 floats, 8 MiB) in a metrics buffer;
every 10th step the buffer is reduced to one number and cleared. Live memory at step
boundaries climbs 8, 16, ... 80 MiB and falls back to 8, twenty times over 200
steps, and the buffer is empty at exit. It never grows beyond one cycle: not a leak.
"""
from _common import need_cuda_torch

torch = need_cuda_torch()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)]).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
outputs = []  # flushed every 10 steps, like a periodically logged metric
means = []
for step in range(200):
    x = torch.randn(512, 4096, device="cuda")
    out = model(x)
    outputs.append(out.detach())  # 8 MiB; detached, so the graph is not kept
    loss = out.square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if len(outputs) == 10:
        means.append(torch.cat(outputs).abs().mean().item())
        outputs.clear()
print(f"{len(means)} flushes of 10 buffered outputs; {len(outputs)} left at exit")
