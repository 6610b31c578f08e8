# expect: clean
"""A clean loop in the most common order: backward, step, then zero_grad, which frees
the gradients after every step. Their memory sits in the cache at exit, ready for the
next step: the loop's working memory, not a finding."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(512, 4096, device="cuda")
for step in range(300):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
    loss = out.float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"loss {loss.item():.4f}")
