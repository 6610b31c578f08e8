# expect: clean
# expect-finding: live-at-exit
# expect-suspects-on: live-at-exit
# expect-holder: __main__.opt.param_groups[*]['params'][*]
# expect-holder-kind: attribute
# expect-args: --trace on
"""A program that deletes its model to give the memory back, but keeps the optimizer: its
param_groups still reference every parameter, so the 512 MiB of weights stay allocated and
nvidia-smi keeps showing them after `del model`. Nothing grows: not a leak, but the question
"who still holds it?" is the same."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(8)])
model.cuda()  # allocates 8 x 64 MiB of weights
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(20):
    x = torch.randn(512, 4096, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
opt.zero_grad()  # the gradients are freed
del model, x, loss  # "the model is gone", but opt still holds its parameters
torch.cuda.synchronize()
print(f"model deleted; {torch.cuda.memory_allocated() >> 20} MiB still allocated")
