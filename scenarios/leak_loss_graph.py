# expect: leak
# expect-holder: __main__.val_total.grad_fn
# expect-holder-kind: autograd-graph
"""A validation loss summed without .item() and outside torch.no_grad(): the running total
keeps every step's autograd graph, and each graph keeps the activations it saved."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
val_total = 0.0
for step in range(120):
    x = torch.randn(1024, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    hidden = model[1](model[0](torch.randn(1024, 1024, device="cuda")))  # allocates: tanh saves it
    val_total = val_total + model[2](hidden).abs().mean()  # should be .item(): keeps the graph
    del hidden
    torch.cuda.synchronize()
print(f"validation total {float(val_total):.3f}")
