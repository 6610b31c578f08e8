# expect: out-of-memory
# expect-exit: 1
# expect-cause: request-too-large
"""Nothing leaks: a small model trains for a few steps, then the program asks for a cache sized
as a fraction of the GPU's memory, with the fraction mistyped (1.5 instead of 0.15). One request
of 1.5 times the whole device can never be served; the OutOfMemoryError is not caught."""
from _common import need_cuda_torch

torch = need_cuda_torch()
CACHE_FRACTION = 1.5  # meant 0.15 of the GPU for the cache

model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(20):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"trained {step + 1} steps; allocating the cache", flush=True)
total = torch.cuda.get_device_properties(0).total_memory
cache = torch.empty(int(total * CACHE_FRACTION), dtype=torch.uint8, device="cuda")
print("cache ready")
