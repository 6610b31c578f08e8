# expect: leak
# expect-finding: out-of-memory
# expect-exit: 1
# expect-cause: accumulation
# expect-holder: __main__.outputs[*]
"""A small training loop that also keeps, for a plot at the end, each step's similarity matrix
between the 16384 embeddings of its batch: 16384 x 16384 floats, 1 GiB a step. The training
itself needs a few hundred MiB; the kept matrices fill the GPU until an allocation fails,
after about 78 steps on an 80 GB card and about 138 on a 141 GB one. The OutOfMemoryError is
not caught: the program ends with it."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
outputs = []
for step in range(10_000):
    x = torch.randn(16384, 1024, device="cuda")
    emb = model(x)
    loss = emb.square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        outputs.append(emb @ emb.T)  # allocates 1 GiB a step, kept for the plot
print(f"{len(outputs)} steps")
