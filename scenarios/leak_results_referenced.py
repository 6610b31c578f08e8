# expect: leak
"""A loop with no optimizer whose every result stays referenced: growth over time."""
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
w = torch.randn(1024, 1024, device="cuda")
results = []
for i in range(150):
    x = torch.randn(1024, 1024, device="cuda")
    results.append(x @ w)  # 4 MiB each, all kept
    torch.cuda.synchronize()
    time.sleep(0.01)
print(f"{len(results)} results")
