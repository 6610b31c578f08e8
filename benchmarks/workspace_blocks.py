"""Which live blocks no tensor holds at a program's end, and whether they are exactly cuBLAS's
workspaces: the ground for an exit search that stops once every other block has its tensor.

For a few small programs (matmuls forward and backward, on a side stream, in a thread, with
CUBLAS_WORKSPACE_CONFIG set), it prints the live blocks that no Python tensor's storage lies in
(sizes, count), and what torch._C._cuda_clearCublasWorkspaces() gives back. Needs a CUDA GPU.

    python3 benchmarks/workspace_blocks.py            # every case, each in a fresh interpreter
    python3 benchmarks/workspace_blocks.py CASE       # one case, in this interpreter
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

CASES = ("forward", "backward", "side_stream", "thread", "config_16_8", "linear_bf16")


def _program(case: str):
    import torch

    dev = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    x = torch.randn(64, 1024, device=dev)
    if case == "forward":
        with torch.no_grad():
            model(x)
    elif case in ("backward", "config_16_8"):
        model(x).sum().backward()
    elif case == "side_stream":
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            model(x).sum().backward()
        torch.cuda.synchronize()
    elif case == "thread":
        t = threading.Thread(target=lambda: model(x).sum().backward())
        t.start()
        t.join()
    elif case == "linear_bf16":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(x).sum().backward()
    torch.cuda.synchronize()
    return model, x


def one(case: str) -> dict:
    import torch

    kept = _program(case)
    covered = set()
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.is_cuda:
            for t in (o, o.grad if o.requires_grad and o.grad_fn is None else None):
                if t is not None:
                    covered.add(t.untyped_storage().data_ptr())
    snap = torch.cuda.memory._snapshot()
    live = [(b["address"], b["size"]) for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    spans = []
    for addr, size in live:
        if not any(addr <= p < addr + size for p in covered):
            spans.append(size)
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    cleared = before - torch.cuda.memory_allocated()
    del kept
    return {"case": case, "torch": torch.__version__, "capability": list(torch.cuda.get_device_capability()),
            "no_tensor_blocks": sorted(spans), "no_tensor_bytes": sum(spans), "cleared_bytes": cleared,
            "exact": sum(spans) == cleared,
            "names": sorted(n for n in dir(torch._C) if "orkspace" in n or "ublas" in n.lower())}


def main() -> int:
    if len(sys.argv) > 1:
        print(json.dumps(one(sys.argv[1])))
        return 0
    for case in CASES:
        env = dict(os.environ)
        if case == "config_16_8":
            env["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
        out = subprocess.run([sys.executable, __file__, case], env=env, capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr.strip()[-800:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
