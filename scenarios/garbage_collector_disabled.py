# expect: garbage-cycle
"""Automatic garbage collection is turned off (gc.disable(), as some training scripts do for speed)
and every step leaves a reference cycle that holds a 16 MiB tensor: 60 of them pile up, and only
gc.collect() at exit frees them. It was `leak` with a generic remedy; the cause is the disabled
collector."""
import gc
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
gc.disable()


class Node:
    def __init__(self, payload):
        self.payload = payload
        self.self_ref = self  # a cycle: only the collector can free it


for step in range(60):
    Node(torch.ones(4 << 20, device="cuda"))  # 16 MiB, garbage at once, freed by no one
    torch.cuda.synchronize()
    time.sleep(0.02)
print("made 60 cycles with the collector off")
