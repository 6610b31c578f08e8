# expect: allocator-cache
"""Batches of many sizes through one Linear layer, nothing kept: memory outside PyTorch grows only
while kernels load. Not a leak, and not memory outside PyTorch that grows: the verdict is PyTorch's
cache (freed blocks of many sizes, kept for reuse, which a program without steps is told about,
as cache_after_matmul.py is), recorded on an H100.

An inference loop without an optimizer or steps: 300 batches, each of a row count drawn anew
(1 to 4096, fixed seed), go through one Linear(4096, 4096); each output is reduced to a Python
number and dropped. cuBLAS chooses its kernel by the shape, and CUDA loads a kernel's module on
its first use (lazy module loading, CUDA's default), so NVML's figure for the process rises in the
first moments of GPU work while the program keeps nothing; cuBLAS's workspace stays in PyTorch's
allocated memory. The whole loop is a fraction of a second of GPU work. Before issue 19 this was
called `non-torch` on an H100: "160 MiB ... kept growing, 597 MiB per second", judged on 0.3 s.
"""
import random

from _common import need_cuda_torch

torch = need_cuda_torch()
torch.manual_seed(0)
rng = random.Random(0)
layer = torch.nn.Linear(4096, 4096).cuda()
sizes = set()
total = 0.0
with torch.no_grad():
    for _ in range(300):
        rows = rng.randint(1, 4096)
        sizes.add(rows)
        batch = torch.randn(rows, 4096, device="cuda")
        total += layer(batch).sum().item()  # a Python number: nothing on the GPU is kept
print(f"{len(sizes)} batch sizes through one Linear; allocated {torch.cuda.memory_allocated() >> 20} MiB "
      f"(the layer and cuBLAS's workspace), reserved {torch.cuda.memory_reserved() >> 20} MiB")
