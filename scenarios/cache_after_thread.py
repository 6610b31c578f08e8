# expect: allocator-cache
"""Memory kept after a worker thread finishes: its freed tensors stay in the cache."""
import threading
import time

from _common import need_cuda_torch

torch = need_cuda_torch()


def worker():
    chunks = [torch.ones(64 << 20, device="cuda") for _ in range(4)]  # 4 x 256 MiB
    total = sum(float(c.sum()) for c in chunks)
    print(f"worker done, sum {total:.0f}")


t = threading.Thread(target=worker, name="loader")
t.start()
t.join()
time.sleep(0.5)
