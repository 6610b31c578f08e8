# expect: leak
# expect-finding: out-of-memory
# expect-exit: 1
# expect-cause: accumulation
# expect-holder: __main__.outputs[*]
"""An evaluation loop that forgets torch.no_grad() and keeps every batch's output: each output
keeps its autograd graph, and the graph keeps the batch it was computed from (what Linear saves
for backward). The outputs and their graphs are one accumulation, about half each; together they
fill the GPU until an allocation fails. The error is not caught."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(8192, 8192).cuda()
outputs = []
for step in range(10_000):
    batch = torch.randn(16384, 8192, device="cuda")
    outputs.append(model(batch))  # allocates 512 MiB a batch: the output, and the input its graph keeps
print(f"{len(outputs)} batches")
