# expect: leak
# expect-holder: __main__.ready[*]
# expect-thread: prefetcher
"""A prefetching thread, started once and running the whole time, puts a new 4 MiB batch on
the GPU every 10 ms into a list that the serving loop reads the newest batch from but never
empties: about 600 MiB over 1.5 s. The main thread has no optimizer and marks no steps, so the
growth can only be seen over time. The thread is stopped and joined at the very end."""
import threading
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
ready = []
stop = threading.Event()


def prefetch():
    while not stop.is_set():
        ready.append(torch.randn(1024, 1024, device="cuda"))  # allocates 4 MiB a batch
        time.sleep(0.01)


model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda().eval()
prefetcher = threading.Thread(target=prefetch, name="prefetcher", daemon=True)
prefetcher.start()
while not ready:
    time.sleep(0.001)
served = 0
start = time.monotonic()
with torch.no_grad():
    while time.monotonic() - start < 1.5:
        logits = model(ready[-1])  # the newest batch; the older ones are never dropped
        torch.cuda.synchronize()
        served += 1
        time.sleep(0.005)
stop.set()
prefetcher.join()
print(f"{served} requests served; {len(ready)} batches still held")
