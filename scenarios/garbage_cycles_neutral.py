# expect: garbage-cycle
"""A loop whose garbage collections are counted, to check that being measured does not change
when the program's collector runs. After setup the program calls gc.collect() once, as training
scripts often do, which also sets the collector's counters to a known state. Each of the 120
steps (about 10 ms of matmuls, a synchronize and a little bookkeeping) makes a node and its
child, which point at each other, around a 16 MiB CUDA tensor and drops them, and keeps a fixed
number of small records, so automatic collections come every few steps, not every step.

It prints one line: CYCLES, the bytes that the reference cycles still held at the end of the
loop (what a final gc.collect() frees), then the number of automatic collections of generations
0, 1 and 2 during the loop. Run plainly, the line is the same every time."""
import gc

from _common import need_cuda_torch

torch = need_cuda_torch()


class Node:
    def __init__(self, payload, parent=None):
        self.payload = payload
        self.parent = parent
        self.children = []
        if parent is not None:
            parent.children.append(self)  # parent -> child -> parent


torch.manual_seed(0)
x = torch.randn(4096, 4096, device="cuda")
w = torch.randn(4096, 4096, device="cuda") / 64
(x @ w).sum().item()  # warm-up: cuBLAS and its workspace
torch.cuda.synchronize()
gc.collect()

log = []
before = gc.get_stats()
for step in range(120):
    h = x
    for _ in range(3):
        h = torch.tanh(h @ w)
    torch.cuda.synchronize()
    root = Node(torch.empty(4 << 20, device="cuda"))  # 16 MiB, held by the cycle
    Node(None, parent=root)
    del root
    log.append([{"step": step, "layer": i, "ok": True} for i in range(120)])
after = gc.get_stats()

gc.disable()  # reading the allocator's stats allocates; no automatic collection before the explicit one
held = torch.cuda.memory_allocated()
gc.collect()
held -= torch.cuda.memory_allocated()
gc.enable()
counts = [b["collections"] - a["collections"] for a, b in zip(before, after)]
print("CYCLES", held, *counts)
