# expect: non-torch
"""Worker threads park CuPy device arrays while a PyTorch loop trains (five of 270 MiB, 1.35 GiB in
all, outside PyTorch's allocator and outside CuPy's pool), and the program lets them go before it
ends. Judged only at exit this was `clean`; the memory still grew while the program ran."""
import sys
import threading
import time

from _common import SKIP_EXIT, need_cuda_torch

torch = need_cuda_torch()
try:
    import cupy
except ImportError:
    print("skip: CuPy is not installed", file=sys.stderr)
    sys.exit(SKIP_EXIT)
cupy.cuda.set_allocator(None)  # plain cudaMalloc and cudaFree, as Numba's device arrays do

release = threading.Event()


def park(i):
    parked = cupy.empty((270 << 20) // 4, dtype=cupy.float32)  # 270 MiB, held until told
    parked.fill(i)
    release.wait()
    del parked


model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
threads = []
for step in range(300):  # about 10 ms a step
    loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    if step in (60, 90, 120, 150, 180):
        threads.append(threading.Thread(target=park, args=(step,), name=f"parker-{len(threads)}"))
        threads[-1].start()
    if step == 260:  # the program's own shutdown of its workers: the arrays go
        release.set()
        for t in threads:
            t.join()
    time.sleep(0.01)
print("parked and released 5 arrays")
