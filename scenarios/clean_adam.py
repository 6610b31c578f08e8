# expect: clean
"""A clean training loop: an MLP trained with Adam. Optimizer state on the first step,
cuBLAS workspaces and the cache filling are warm-up, not a leak."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for step in range(400):
    x = torch.randn(512, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}")
torch.cuda.synchronize()
