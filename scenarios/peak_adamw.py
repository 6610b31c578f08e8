# expect: clean
"""A training loop with AdamW over eight 4096x4096 layers (512 MiB of parameters in float32): what
made its peak is known from the program itself. AdamW keeps two moments per parameter (exp_avg and
exp_avg_sq), so its state is twice the parameters; the gradients equal them once backward() ran.
The program prints those sums, read from its own objects, on a `peak-truth:` line; the GPU test
compares the report's parts with them."""
import json
import sys

from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def storages(tensors) -> int:
    seen = {}
    for t in tensors:
        if t is not None and t.is_cuda:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


for step in range(40):
    x = torch.randn(1024, 4096, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=False)  # the gradients stay allocated between steps
    loss.backward()
    opt.step()
    torch.cuda.synchronize()

params = list(model.parameters())
truth = {"parameters": storages(params), "gradients": storages(p.grad for p in params),
         "optimizer_state": storages(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))}
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
