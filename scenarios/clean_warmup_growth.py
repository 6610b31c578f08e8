# expect: clean
"""Growth that stops: a replay buffer fills during the first 10 steps, then stays full.

Each step adds a new 8 MiB batch of experience to a buffer of at most 10 batches and
trains on a random one of them. Live memory grows by 8 MiB a step up to 80 MiB, then the
oldest batch is dropped as each new one comes: flat for the remaining 190 steps.
Warm-up, not a leak.
"""
import collections
import random

from _common import need_cuda_torch

torch = need_cuda_torch()
torch.manual_seed(0)
rng = random.Random(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)]).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
buffer = collections.deque(maxlen=10)  # the last 10 batches, the oldest dropped first
for step in range(200):
    buffer.append(torch.randn(512, 4096, device="cuda"))  # 512 x 4096 floats = 8 MiB
    x = buffer[rng.randrange(len(buffer))]  # replay a stored batch
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"replay buffer of {len(buffer)} batches, {sum(t.nbytes for t in buffer) >> 20} MiB; "
      f"loss {loss.item():.4f}")
