# expect: leak
# expect-holder: __main__.buf
"""A buffer grown with `buf = torch.cat([buf, x])`: one tensor that replaces itself, 1 MiB larger
each step. Its allocating line is the `cat`, the stack of its latest allocation recorded."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
buf = torch.empty(0, 1024, device="cuda")
for step in range(200):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=False)  # gradients made once, not each step
    loss.backward()
    opt.step()
    buf = torch.cat([buf, x.detach()])  # allocates
    torch.cuda.synchronize()
print(f"buffer of {buf.shape[0]} rows")
