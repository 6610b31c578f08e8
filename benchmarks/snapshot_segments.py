#!/usr/bin/env python3
"""Does this PyTorch leave the event ring out of a snapshot asked for (0, 0, False), with the same
segments (private pools too), and how long does each take with the history ring full?"""
import sys, time
import torch
from gpumemdoctor._agent.search import blocks

print("torch", torch.__version__, "python", sys.version.split()[0])
torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=int(sys.argv[1]))
keep = [torch.empty(1 << 20, device="cuda") for _ in range(40)]
for i in range(int(sys.argv[1]) // 2):
    t = torch.empty(4096, device="cuda"); del t
g = torch.cuda.CUDAGraph()
x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y = x * 2
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    y = x * 2
torch.cuda.synchronize()

def seg_key(snap):
    return sorted((sg["address"], sg["total_size"], tuple(sg.get("segment_pool_id") or ()),
                   tuple((b["address"], b["size"], b["state"], len(b.get("frames") or [])) for b in sg["blocks"]))
                  for sg in snap["segments"])

full = torch.cuda.memory._snapshot()
fast = blocks.snapshot(torch)
print("full keys", sorted(full), "traces", [len(t) for t in full.get("device_traces", [])])
print("fast keys", sorted(fast), "traces", [len(t) for t in fast.get("device_traces", [])])
print("segments equal", seg_key(full) == seg_key(fast), "segments", len(full["segments"]),
      "private", sum(1 for sg in full["segments"] if tuple(sg.get("segment_pool_id") or (0, 0)) != (0, 0)))
for name, fn in (("full", torch.cuda.memory._snapshot), ("fast", lambda: blocks.snapshot(torch)),
                 ("live_blocks", lambda: blocks.live_blocks(torch))):
    ts = []
    for _ in range(7):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    ts.sort()
    print(f"{name}: median {ts[3]*1e3:.3f} ms min {ts[0]*1e3:.3f} ms")
rc0, rcf = sys.getrefcount(0), sys.getrefcount(False)
for _ in range(2000):
    blocks.snapshot(torch)
print("refcount drift of 0:", sys.getrefcount(0) - rc0, "of False:", sys.getrefcount(False) - rcf)
t0 = time.perf_counter(); b = blocks.take_baseline(torch, blocks.TensorKind(torch)); print("baseline", len(b["blocks"]), f"{(time.perf_counter()-t0)*1e3:.3f} ms")
