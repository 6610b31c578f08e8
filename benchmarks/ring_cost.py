"""What a reading of PyTorch's allocation events costs by the ring's size, with and without the
entries that history.py skips (a free's completion, a snapshot's mark): PyTorch's snapshot with the
events only (reading.events_only) and the walk back (replay.py), medians of seven, on one GPU.

    python3 benchmarks/ring_cost.py

A small AdamW loop (eight 512x512 layers) fills the ring; each line gives the entries, the snapshot's
and the walk's milliseconds, and the actions the ring held."""
from __future__ import annotations

import collections
import inspect
import statistics
import sys
import time

from _loop import cuda_torch_here


def main() -> int:
    torch = cuda_torch_here("ring_cost")
    if torch is None:
        return 0
    from gpumemdoctor._agent.peak import replay
    from gpumemdoctor._agent.peak.reading import events_only
    from gpumemdoctor._agent.search.blocks import py_incref

    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    print(inspect.signature(torch.cuda.memory._record_memory_history_impl))
    incref = py_incref()
    net = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(net.parameters())
    x = torch.randn(64, 512, device="cuda")

    def steps(n):
        for _ in range(n):
            loss = net(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    steps(3)
    for skip in ([], ["free_completed"], ["free_completed", "snapshot"]):
        for cap in (2048, 4096, 8192, 16384):
            torch.cuda.memory._record_memory_history(None)
            torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=cap,
                                                     clear_history=True, skip_actions=skip)
            steps(cap // 20 + 50)
            snap_t, walk_t = [], []
            for _ in range(7):
                t0 = time.perf_counter()
                s = events_only(torch, incref)
                t1 = time.perf_counter()
                trace = s["device_traces"][0]
                replay.replay(trace, torch.cuda.memory_allocated(), [], [], {}, {}, torch.cuda.memory_reserved(),
                              torch.cuda.max_memory_allocated(), True)
                t2 = time.perf_counter()
                snap_t.append(t1 - t0)
                walk_t.append(t2 - t1)
                actions = collections.Counter(e["action"] for e in trace)
                n = len(trace)
                keys = sorted(trace[0]) if trace else []
                del s, trace
            print(f"skip={skip} cap={cap} entries={n} snapshot={statistics.median(snap_t) * 1e3:.2f} ms "
                  f"walk={statistics.median(walk_t) * 1e3:.2f} ms actions={dict(actions)} keys={keys}", flush=True)
    torch.cuda.memory._record_memory_history(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
