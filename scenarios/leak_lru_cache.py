# expect: leak
# expect-holder: __main__.features's lru_cache
# expect-holder-kind: cache
"""A memoised feature function (functools.lru_cache with no bound) called with a new key every
step: the cache keeps every 4 MiB result on the GPU, and no variable of the program refers to them."""
import functools

from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


@functools.lru_cache(maxsize=None)
def features(key):
    g = torch.Generator(device="cuda").manual_seed(key)
    return torch.randn(1024, 1024, device="cuda", generator=g)  # allocates


for step in range(150):
    x = features(step)  # a new key each step: a new entry
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
print(f"cached {features.cache_info().currsize} results")
