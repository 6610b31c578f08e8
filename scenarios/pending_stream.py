# expect: pending-stream
"""A tensor used on a side stream, marked with record_stream and deleted while that
stream still has seconds of queued work: freed in Python, held for the stream."""
from _common import need_cuda_torch

torch = need_cuda_torch()
side = torch.cuda.Stream()
big = torch.zeros(256 << 20, device="cuda")  # 1 GiB
a = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
with torch.cuda.stream(side):
    for _ in range(20):
        c = a @ a
    big.add_(1)
    # Seconds of work still queued when the program ends, whatever the GPU's speed: a spin kernel of
    # 4e9 clock cycles (about 2 s at an H100's or H200's 1.98 GHz). On an H200, 100 of the matmuls
    # above had finished before the program's end.
    torch.cuda._sleep(int(4e9))
big.record_stream(side)
del big
print("freed while the side stream is busy:", not side.query())
