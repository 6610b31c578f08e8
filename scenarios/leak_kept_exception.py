# expect: leak
# expect-holder: __main__.errors[*].__traceback__
# expect-holder-kind: kept-exception
"""A loop that stores every exception it catches: each traceback keeps the failing frame's
locals alive, here a 4 MiB scratch buffer per step."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
errors = []


def augment(batch):
    scratch = torch.empty(1024, 1024, device="cuda")  # allocates 4 MiB, a local of this frame
    if batch.sum() > -1e9:
        raise ValueError("bad sample")
    return scratch


for step in range(120):
    x = torch.randn(256, 1024, device="cuda")
    try:
        x = augment(x)
    except ValueError as exc:
        errors.append(exc)  # the exception keeps its traceback, and the traceback keeps `scratch`
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
print(f"{len(errors)} exceptions kept")
