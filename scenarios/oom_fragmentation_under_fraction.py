# expect: out-of-memory
# expect-exit: 1
# expect-cause: fragmentation
"""oom_fragmentation.py's pattern under a memory cap: torch.cuda.set_per_process_memory_fraction
allows the program 6 GiB of the GPU. Each round decodes a chunk into a 1 GiB staging buffer inside a
helper (freed on return, its segment cached whole), then keeps the chunk's 640 MiB result, which the
allocator carves out of that cached segment: each segment ends as 640 MiB in use and a 384 MiB hole.
The rounds stop when one more 1 GiB segment would come within 64 MiB of the cap: five segments, 5 GiB
reserved, 1.88 GiB free in holes of 384 MiB. Then one 1.5 GiB buffer is asked for: the holes add up to more than
the request but none is large enough, and a new segment would pass the cap. Fragmentation, under a
limit of 6 GiB: nothing here may be said to fit in more than that.

Before the request the program prints its ground truth (the cap, reserved and allocated memory, the
free holes inside the segments, read from torch.cuda.memory_snapshot()); it catches the error only to
print the first line of its message ("... GiB allowed"), and raises it again."""
import sys

from _common import need_cuda_torch

torch = need_cuda_torch()
GiB, MiB = 1 << 30, 1 << 20
CAP = 6 * GiB
STAGING = 256 << 20  # floats: 1 GiB
RESULT = 160 << 20  # floats: 640 MiB
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(CAP / total)  # the limit in force: 6 GiB of this GPU


def decode(chunk):
    raw = torch.empty(STAGING, device="cuda")
    raw.normal_(mean=float(chunk), std=1.0)  # stand-in for decoding chunk into the buffer
    return float(raw[:4096].mean())  # raw is freed on return; its segment stays cached


results = []
while torch.cuda.memory_reserved() + GiB + 64 * MiB <= CAP:  # room for one more staging segment under the cap
    level = decode(len(results))
    results.append(torch.full((RESULT,), level, device="cuda"))  # 640 MiB out of the cached 1 GiB
holes = [b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"] if b["state"] == "inactive"]
print(f"truth: cap {CAP / GiB:.1f} GiB (fraction {CAP / total:.4f} of {total / GiB:.1f} GiB); {len(results)} chunks "
      f"kept; reserved {torch.cuda.memory_reserved() / GiB:.2f} GiB, allocated "
      f"{torch.cuda.memory_allocated() / GiB:.2f} GiB; free inside the segments {sum(holes) / GiB:.2f} GiB in "
      f"{len(holes)} holes, the largest {max(holes) / MiB:.0f} MiB; the request 1536 MiB", flush=True)
try:
    merged = torch.empty(384 << 20, device="cuda")  # 1.5 GiB: fails
except torch.OutOfMemoryError as exc:
    print(f"truth: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
    raise
print("merged")
