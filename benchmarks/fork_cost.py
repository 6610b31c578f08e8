"""What os.fork costs a process at each stage of a CUDA program's life: how long the parent waits
for the fork (the pause a holder search in a copy adds to the program), against the process's own
resident memory (resident minus shared pages: what forked.private_bytes reads).

Each stage runs in a fresh process, which forks --forks times (the child leaves at once) and reports
the median and the highest pause: plain Python; torch imported; CUDA started (one small tensor);
cuBLAS loaded (a matmul); then --host-gib GiB of the program's own host memory (a numpy-free bytearray,
touched); then a pinned host buffer of --pinned-mib MiB. The agent's estimate of a fork's pause
(forked.expected_pause_s) is made from what this prints.

    python benchmarks/fork_cost.py --forks 7 --json out.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

STAGES = ("python", "torch", "cuda", "cublas", "host", "pinned")

CHILD = r"""
import json, os, statistics, sys, time
stage, forks, host_gib, pinned_mib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
order = %r
keep = []
if order.index(stage) >= 1:
    import torch
if order.index(stage) >= 2:
    keep.append(torch.ones(1, device="cuda"))
    torch.cuda.synchronize()
if order.index(stage) >= 3:
    a = torch.randn(1024, 1024, device="cuda")
    keep.append(a @ a)
    torch.cuda.synchronize()
if order.index(stage) >= 4:
    buf = bytearray(int(host_gib * (1 << 30)))
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    keep.append(buf)
if order.index(stage) >= 5:
    p = torch.empty(pinned_mib << 20, dtype=torch.uint8, pin_memory=True)
    p.fill_(1)
    keep.append(p)

def private():
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")

pauses = []
for _ in range(forks):
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    pauses.append(time.perf_counter() - started)
    os.waitpid(pid, 0)
    time.sleep(0.05)
with open("/proc/self/status") as f:
    status = dict(line.split(":", 1) for line in f if ":" in line)
print(json.dumps({"stage": stage, "private_bytes": private(), "rss_anon_kb": status.get("RssAnon", "").strip(),
                  "vm_size_kb": status.get("VmSize", "").strip(), "maps": len(open("/proc/self/maps").read().splitlines()),
                  "first_ms": round(pauses[0] * 1000, 2), "median_ms": round(statistics.median(pauses) * 1000, 2),
                  "max_ms": round(max(pauses) * 1000, 2)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forks", type=int, default=7)
    parser.add_argument("--host-gib", type=float, default=1.0)
    parser.add_argument("--pinned-mib", type=int, default=256)
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for stage in args.stages.split(","):
        out = subprocess.run([sys.executable, "-c", CHILD % (STAGES,), stage, str(args.forks), str(args.host_gib),
                              str(args.pinned_mib)], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            print(f"{stage}: failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{stage:8} own {row['private_bytes'] / (1 << 30):6.2f} GiB  maps {row['maps']:6}  "
              f"fork first {row['first_ms']:7.2f} ms  median {row['median_ms']:7.2f} ms  max {row['max_ms']:7.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"forks": args.forks, "host_gib": args.host_gib, "pinned_mib": args.pinned_mib,
                       "when": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
