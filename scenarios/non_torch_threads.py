# expect: non-torch
"""Raw device memory allocated by threads that end without freeing it (CuPy's runtime
malloc, outside any pool): five worker threads, one after another, 64 MiB each."""
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


time.sleep(0.2)
for i in range(5):  # a request handler that leaks what it allocates, every 0.3 s
    t = threading.Thread(target=worker, name=f"raw-{i}")
    t.start()
    t.join()
    time.sleep(0.3)
print(f"{len(pointers)} raw allocations outlive their threads")
