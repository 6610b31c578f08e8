"""Issue 57 bisection (GPU): the Lightning-like loop (MLP 1024-4096-1024, batch 512 from a DataLoader,
AdamW, outputs kept) with PyTorch's memory history set as the agent sets it, no agent at all.
    python benchmarks/history_alone_gaps.py none|events|window|bigring|stacksonly [RING_ENTRIES]
Prints the longest step gap and its step."""
import statistics
import sys
import time

import torch
mode = sys.argv[1]
cap = int(sys.argv[2]) if len(sys.argv) > 2 else 5734
dev = torch.device("cuda")
rec = torch.cuda.memory._record_memory_history
def hist(stacks, capacity=cap):
    rec(enabled="all", context="state" if stacks else None, stacks="python", max_entries=capacity,
        skip_actions=["free_completed", "snapshot"])
torch.cuda.init()
if mode in ("events", "window"): hist(False)
if mode == "bigring": hist(False, 100000)
net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256 * 512, 1024)), batch_size=512)
kept, ends = [], []
for step, (x,) in enumerate(data):
    if step == 24:
        if mode in ("window",): hist(True)
        if mode == "bigring": hist(True, 100000)
        if mode == "stacksonly": rec(enabled="state", context="alloc", stacks="python", max_entries=100000)
    if step == 41:
        if mode == "window": hist(False)
        if mode == "bigring": hist(False, 100000)
        if mode == "stacksonly": rec(enabled=None)
    x = x.to(dev, non_blocking=True)
    out = net(x); kept.append(out)
    loss = out.pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    ends.append(time.perf_counter())
gaps = [b - a for a, b in zip(ends[5:], ends[6:])]
i = gaps.index(max(gaps))
print(f"{mode} cap={cap}: median {statistics.median(gaps)*1e3:.2f} ms, max {max(gaps)*1e3:.1f} ms at step {i+6}; "
      f"other gaps >30 ms: {[(j+6, round(g*1e3)) for j, g in enumerate(gaps) if g > 0.03 and j != i]}")
