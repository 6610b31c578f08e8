# expect: clean
"""A clean Adam loop on the cudaMallocAsync backend, whose pool keeps what it frees.

The batch size changes every step (256 to 4096 rows, fixed seeds), so activations
come in many sizes. CUDA's stream-ordered pool keeps what is freed until
empty_cache(), synchronize or not (docs/gpu-facts.md), so `reserved` rises to the
largest step's working set and stays there, while the live tensors at each step
boundary stay flat (only the input varies, and it is at most 8 MiB). Not a leak.
"""
import os
import random

# torch reads the allocator backend once, when it is imported (the import inside
# need_cuda_torch below): set later, this setting would be silently ignored.
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"

from _common import need_cuda_torch  # noqa: E402

torch = need_cuda_torch()
torch.manual_seed(0)
rng = random.Random(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 512)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for step in range(200):
    x = torch.randn(rng.randint(256, 4096), 512, device="cuda")  # 0.5 to 8 MiB
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"backend {torch.cuda.get_allocator_backend()}: reserved {torch.cuda.memory_reserved() >> 20} "
      f"MiB, allocated {torch.cuda.memory_allocated() >> 20} MiB")
