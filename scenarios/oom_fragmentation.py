# expect: out-of-memory
# expect-exit: 1
# expect-cause: fragmentation
"""An out-of-memory error caused by fragmentation of PyTorch's caching allocator, not by a lack
of memory: when it fails, tens of GiB are reserved by PyTorch but unallocated.

Each round decodes a chunk into a 1 GiB staging buffer inside a helper; the buffer is freed when
the helper returns, and its 1 GiB segment stays in PyTorch's cache, whole. The caller then
allocates the chunk's 640 MiB result, which the allocator carves out of that cached segment (the
smallest free block that fits; the 384 MiB left over is more than 1 MiB, so the block is split).
The result is kept, so each segment ends as 640 MiB in use and 384 MiB free. The free pieces are
too small for the next round's 640 MiB result and its 1 GiB buffer, so every round takes a new
segment from CUDA. (With equal halves, a 2 GiB buffer and a 1 GiB result, each result would fill
the free half of the previous segment exactly and the cache would not fragment.)

The rounds stop while the device still has less than 1.25 GiB free, before any allocation
fails. Then one 1.5 GiB buffer is asked for: no free piece in the cache is that large, CUDA has
too little left, and the allocator's last resort, giving back its cached segments that are not
split, finds none to give back: every segment holds a live result. The OutOfMemoryError is not
caught; its message shows the tens of GiB reserved but unallocated. Relies on the default
(native) allocator without expandable segments."""
from _common import need_cuda_torch

torch = need_cuda_torch()
GiB = 1 << 30
STAGING = 256 << 20  # floats: 1 GiB
RESULT = 160 << 20  # floats: 640 MiB


def decode(chunk):
    raw = torch.empty(STAGING, device="cuda")
    raw.normal_(mean=float(chunk), std=1.0)  # stand-in for decoding chunk into the buffer
    return float(raw[:4096].mean())  # raw is freed on return; its segment stays cached


results = []
free, total = torch.cuda.mem_get_info()
while free >= GiB + GiB // 4:  # room for one more staging buffer, with a margin
    level = decode(len(results))
    results.append(torch.full((RESULT,), level, device="cuda"))  # 640 MiB out of the cached 1 GiB
    free, total = torch.cuda.mem_get_info()
unused = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
print(f"{len(results)} chunks kept; {unused / GiB:.1f} GiB reserved but unallocated, "
      f"{free / GiB:.2f} GiB free on the device", flush=True)
merged = torch.empty(384 << 20, device="cuda")  # 1.5 GiB: fails
print("merged")
