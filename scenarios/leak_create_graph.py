# expect: leak
"""pytorch/pytorch#7343: a gradient penalty computed with backward(create_graph=True) on a leaf.
x.grad then carries a graph of its own, and that graph refers back to x, so x -> x.grad ->
grad_fn -> x is a reference cycle inside autograd's C++ objects. Python's garbage collector
cannot see it: after `del x`, nothing in Python holds the memory, gc.collect() frees none of it,
and x and its gradient stay allocated: 128 MiB a step, 5 GiB after 40 steps. (torch warns
about this cycle; torch.autograd.grad would not make it.)"""
from _common import need_cuda_torch

torch = need_cuda_torch()
penalties = []
for step in range(40):
    x = torch.randn(16 << 20, device="cuda", requires_grad=True)  # 64 MiB
    energy = (x * x).sum()
    energy.backward(create_graph=True)  # x.grad = 2x, with a graph that saved x
    penalties.append(x.grad.square().mean().item())
    del x, energy
torch.cuda.synchronize()
print(f"{len(penalties)} penalties; {torch.cuda.memory_allocated() >> 20} MiB still allocated")
