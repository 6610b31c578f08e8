"""What `torch.cuda.memory._snapshot()` costs with allocation stacks on (Python stacks, the
trace's settings): N live blocks allocated at a Python depth D, median of 5 snapshots.

    python benchmarks/snapshot_cost.py [--json PATH]

The question it answers: can a probe in the program's pause read the allocating line of the
blocks it names (a snapshot within a few ms), or must that stay with a search in a copy?"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("skip: no CUDA", file=sys.stderr)
        return 0
    torch.cuda.memory._record_memory_history(enabled="state", context="alloc", stacks="python",
                                             max_entries=100000)
    rows = []
    for depth in (10, 60):
        for n in (100, 300, 1000, 3000):
            kept = []

            def nest(d):
                if d:
                    return nest(d - 1)
                for _ in range(n):
                    kept.append(torch.empty(1 << 20, device="cuda"))  # 4 MiB blocks

            nest(depth)
            times = []
            for _ in range(5):
                t = time.perf_counter()
                snap = torch.cuda.memory._snapshot()
                times.append(time.perf_counter() - t)
            blocks = sum(len(s["blocks"]) for s in snap["segments"])
            rows.append({"depth": depth, "tensors": n, "blocks": blocks,
                         "median_ms": round(statistics.median(times) * 1000, 3),
                         "first_ms": round(times[0] * 1000, 3)})
            print(rows[-1], flush=True)
            kept.clear()
            del snap
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
