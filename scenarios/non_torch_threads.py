# expect: non-torch
"""Raw device memory allocated by threads that end without freeing it (CuPy's runtime
malloc, outside any pool): five threads, 64 MiB each."""
import sys
import threading
import time

from _common import SKIP_EXIT

try:
    import cupy
except ImportError:
    print("skip: CuPy is not installed", file=sys.stderr)
    sys.exit(SKIP_EXIT)
try:
    import torch
    if torch.cuda.is_available():
        torch.ones(1, device="cuda")  # a PyTorch program that also uses a CuPy-based library
except ImportError:
    pass

pointers = []


def worker():
    pointers.append(cupy.cuda.runtime.malloc(64 << 20))  # never freed


threads = [threading.Thread(target=worker, name=f"raw-{i}") for i in range(5)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"{len(pointers)} raw allocations outlive their threads")
time.sleep(0.5)
