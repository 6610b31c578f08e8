# expect: clean
# expect-finding: temporary-peak
"""A large temporary: prepare() up-casts a 1 GiB bfloat16 tensor to float32 (a 2 GiB copy) and works
on the copy for a while before it returns, so the copy, a local of a running function, makes the
peak. The program prints the copy's size on a `peak-truth:` line; the GPU test finds it in the
peak's `temporaries` part, held by `prepare() local wide`, and the global `data` in kept tensors."""
import json
import sys
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
data = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB, kept all along
truth = {}


def prepare():
    wide = data.float()  # a whole new 2 GiB tensor
    truth["temporary"] = wide.untyped_storage().nbytes()
    stats = []
    end = time.monotonic() + 0.6
    while time.monotonic() < end:  # statistics over the copy, a slice at a time
        stats.append(wide[: 1 << 20].mean())
        time.sleep(0.01)
    return torch.stack(stats).mean().item()


for _ in range(3):
    print(f"prepared: {prepare():.4f}")
    time.sleep(0.2)
truth["kept"] = data.untyped_storage().nbytes()
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
torch.cuda.empty_cache()  # the end: nothing left in the cache (a clean run)
