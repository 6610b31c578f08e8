# expect: unknown
"""The same 2.5 GiB kept, then a second of nothing, then os._exit(0): the samples saw the memory
held and flat, and no exit probe or holder search ran. It was `clean` ("nothing unexpected is
held") with 2.5 GiB live; the report must say what the agent saw and that the end was not seen."""
import os
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
kept = [torch.ones(16 << 20, device="cuda") for _ in range(40)]
torch.cuda.synchronize()
time.sleep(1.0)
os._exit(0)
