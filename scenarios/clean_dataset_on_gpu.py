# expect: clean
"""A dataset loaded onto the GPU once at start-up (64 batches of 16 MiB, 1 GiB, as a list), then
three epochs of training on it, each followed by a validation over the same batches under
torch.no_grad(). Many alike tensors under one root, but their number never grows: filled once and
left alone, clean (shown as live at exit), although validations pause the steps."""
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
dataset = [torch.randn(4096, 1024, device="cuda") for _ in range(64)]  # 1 GiB, loaded once
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def validate():
    model.eval()
    with torch.no_grad():
        score = sum(model(batch).abs().mean().item() for batch in dataset[:16])
        time.sleep(0.2)  # the metric's own work
    model.train()
    return score


for epoch in range(3):
    for step in range(80):
        loss = model(dataset[step % 64]).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
    print(f"epoch {epoch}: {validate():.3f}")
