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
    for _ in range(100):  # about two seconds of work queued on the side stream
        c = a @ a
    big.add_(1)
big.record_stream(side)
del big
print("freed while the side stream is busy:", not side.query())
