# expect: leak
# expect-holder: __main__.model._forward_hooks[
# expect-holder-kind: hook
"""A forward hook that records every output of a layer in a list of its closure: 4 MiB a step."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


def record_outputs(module):
    outputs = []
    module.register_forward_hook(lambda mod, args, out: outputs.append(out.detach()))


record_outputs(model)
for step in range(120):
    x = torch.randn(1024, 1024, device="cuda")
    loss = model(x).square().mean()  # allocates the model's output, which the hook keeps
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
print("done")
