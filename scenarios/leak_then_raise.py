# expect: leak
# expect-exit: 1
# expect-holder: __main__.keep[*]
"""Features are computed shard by shard and kept on the GPU in a module-level list, 64 MiB a
shard, until the index is written at the end. The program then fails with an uncaught
RuntimeError: the 1.875 GiB it kept are still held when the traceback is printed."""
from _common import need_cuda_torch

torch = need_cuda_torch()
keep = []
for shard in range(30):
    features = torch.randn(16 << 20, device="cuda")  # allocates 64 MiB a shard
    keep.append(features)
torch.cuda.synchronize()
if len(keep) != 32:
    raise RuntimeError(f"expected 32 shards, found {len(keep)}: the index is incomplete")
print("index written")
