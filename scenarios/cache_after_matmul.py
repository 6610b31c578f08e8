# expect: allocator-cache
"""Tensors freed after a big matmul: the memory stays in PyTorch's cache."""
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
a = torch.randn(8192, 8192, device="cuda")
b = torch.randn(8192, 8192, device="cuda")
c = a @ b
torch.cuda.synchronize()
print(f"checksum {c[0, 0].item():.3f}")
del a, b, c
time.sleep(0.5)
