# expect: unknown
"""Keeps 40 tensors of 64 MiB (2.5 GiB), then leaves through os._exit(0) at once: no exit hook
runs, and the sampler has had no time to watch. The report must say what it saw and that the end
was not seen, and pick no category that nothing observed (it said `non-torch`, "no PyTorch
allocator was seen")."""
import os

from _common import need_cuda_torch

torch = need_cuda_torch()
kept = [torch.ones(16 << 20, device="cuda") for _ in range(40)]
torch.cuda.synchronize()
os._exit(0)
