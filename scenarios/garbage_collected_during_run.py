# expect: garbage-cycle
"""Every step makes a request and its response, which point at each other, around a 64 MiB
CUDA tensor, and drops them: a reference cycle, freed only by a garbage collection. The step
also keeps 300 small dicts of metrics, enough new objects to set off Python's automatic
collector every two or three steps, and that is what frees the cycles during the run, after they have
held their memory for a while. The program calls gc.collect() at the end, so nothing is left in
cycles at exit: the garbage only shows during the run."""
import gc
import time

from _common import need_cuda_torch

torch = need_cuda_torch()


class Request:
    def __init__(self, features):
        self.features = features
        self.response = Response(self)


class Response:
    def __init__(self, request):
        self.request = request  # request -> response -> request
        self.scores = None


a = torch.randn(1024, 1024, device="cuda")
history = []
before = [s["collections"] for s in gc.get_stats()]
for step in range(60):
    request = Request(torch.empty(16 << 20, device="cuda"))  # 64 MiB, held by the cycle
    request.features[: a.numel()].copy_(a.flatten())
    request.response.scores = (a @ a).sum(dim=0)
    torch.cuda.synchronize()
    del request
    history.append([{"step": step, "item": i, "score": i * 0.5} for i in range(300)])
    time.sleep(0.02)
after = [s["collections"] for s in gc.get_stats()]
gc.collect()
print(f"{len(history)} steps; automatic collections by generation: "
      f"{[n - m for m, n in zip(before, after)]}")
