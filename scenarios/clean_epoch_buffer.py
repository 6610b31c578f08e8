# expect: clean
"""Three epochs of training, each keeping its steps' outputs (4 MiB a step) for a metric computed
and cleared at the end of the epoch: memory rises through each epoch and falls back at its end, as
a buffer reset every epoch does. A sawtooth: the other side of the line from a leak that grows
for the whole loop (leak_released_at_return.py)."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
epoch_outputs = []
for epoch in range(3):
    for step in range(60):
        x = torch.randn(1024, 1024, device="cuda")
        out = model(x)
        loss = out.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        epoch_outputs.append(out.detach())
        torch.cuda.synchronize()
    metric = torch.cat(epoch_outputs).abs().mean().item()
    epoch_outputs.clear()  # the epoch's buffer, reset
    print(f"epoch {epoch}: {metric:.4f}")
