# expect: leak
# expect-holder: __main__.worker_state
"""A server that makes a ThreadPoolExecutor for each request and keeps it in a dict "to reuse it
later", which nobody does. Each worker thread keeps a 64 MiB scratch tensor in a threading.local, so
every live worker holds its own: 120 requests, 120 worker threads, 7.5 GiB, growing for the whole
run. No autograd runs at all (plain tensors, no requires_grad). The memory is let go of only by the
interpreter's shutdown: concurrent.futures joins its workers at exit (threading._shutdown runs its
exit hook), each ending thread drops its thread-local dict, and with it its scratch tensor. Until
then it is held: a leak, held by the workers' thread-local `scratch` (the global `worker_state`),
allocated at the marked line.

At its end the program prints its ground truth: the live worker threads, what they hold, PyTorch's
figures; and, from an atexit hook (atexit hooks run after threading._shutdown, in which
concurrent.futures joins its workers), the allocated memory then, which proves that the shutdown
released it."""
import atexit
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _common import need_cuda_torch

torch = need_cuda_torch()
MiB = 1 << 20
REQUESTS = 120


def after_the_join():
    alive = sum(t.name.startswith("request-") for t in threading.enumerate())
    print(f"truth: at exit, after threading._shutdown (concurrent.futures joined its workers): {alive} worker "
          f"threads alive, allocated {torch.cuda.memory_allocated() / MiB:.0f} MiB", flush=True)


atexit.register(after_the_join)
worker_state = threading.local()
weights = torch.randn(4096, 1024, device="cuda")  # a plain tensor: no autograd anywhere
executors = {}


def handle(request_id):
    if not hasattr(worker_state, "scratch"):
        worker_state.scratch = torch.empty(4096, 4096, device="cuda")  # allocates 64 MiB per worker thread
    scratch = worker_state.scratch
    scratch.normal_()
    return float((scratch[:, :1024] @ weights.T).abs().mean())


for request_id in range(REQUESTS):
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"request-{request_id}")
    executors[request_id] = pool  # kept "to reuse later": its worker thread stays alive, waiting
    pool.submit(handle, request_id).result()
    torch.cuda.synchronize()
    time.sleep(0.02)

workers = [t for t in threading.enumerate() if t.name.startswith("request-")]
print(f"truth: {len(executors)} executors kept, {len(workers)} worker threads alive, each with a "
      f"thread-local scratch of 64 MiB: {len(workers) * 64} MiB")
print(f"truth: allocated {torch.cuda.memory_allocated() / MiB:.0f} MiB, reserved "
      f"{torch.cuda.memory_reserved() / MiB:.0f} MiB, max allocated {torch.cuda.max_memory_allocated() / MiB:.0f} MiB, "
      f"grad enabled {torch.is_grad_enabled()}, weights.requires_grad {weights.requires_grad}", flush=True)
