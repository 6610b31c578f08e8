# expect: clean
# expect-finding: fragmented-peak
"""A fragmented allocator at the peak: a 1 GiB segment is carved into 64 blocks of 15 MiB, every other
one is freed, and the 200 MiB tensors that follow fit in none of the holes, so PyTorch reserves new
segments while 544 MiB sits free inside the split one. The program reads PyTorch's own
`inactive_split_bytes` at that moment and prints it on a `peak-truth:` line; the GPU test finds it
as the peak's fragmentation."""
import json
import sys
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
del big  # its segment stays reserved, free
small = [torch.empty(15 << 20, dtype=torch.uint8, device="cuda") for _ in range(64)]
kept = small[::2]
del small
large = [torch.empty(200 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
truth = {"fragmentation": stats["inactive_split_bytes.all.current"], "reserved": stats["reserved_bytes.all.current"],
         "allocated": stats["allocated_bytes.all.current"]}
time.sleep(0.5)  # held: the readings see it
del large, kept
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
torch.cuda.empty_cache()  # the end: nothing left in the cache (a clean run)
