"""Does giving the allocator's cache back at exit shorten a CUDA program's end?

    python benchmarks/exit_release.py [--gib 16] [--block-mib 64] [--pairs 8] [--json PATH]

At its exit the agent synchronizes and calls torch.cuda.empty_cache() (its "release" probe, 6-12
ms in the corpus's training programs), before the interpreter tears the program down. The
corpus's ResNet-50 runs showed the end after the loop longer under the tool by less than the
tool's own work there (its exit search, the release, the command's end): this measures the
part the release may play. A child process fills the cache with `--gib` GiB in blocks of
`--block-mib` MiB (allocated, then freed: cached, as a training step leaves its activations),
prints the wall clock when its atexit hook starts, and exits; in the "release" runs the hook
first calls torch.cuda.synchronize() and torch.cuda.empty_cache(), as the agent does. Plain and
release alternate, `--pairs` of each; the figure is the time from the hook's start to the
child's reaping by this process (its teardown: the interpreter's finalization and CUDA's).
Needs torch with a CUDA GPU; elsewhere it prints why it is skipped and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _loop import cuda_torch_here  # noqa: E402

CHILD = """
import atexit, sys, time
import torch
gib, block_mib, release = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
blocks = [torch.empty(block_mib << 20, dtype=torch.uint8, device="cuda")
          for _ in range(int(gib * 1024 // block_mib))]
del blocks  # freed to the cache: reserved, not allocated
torch.cuda.synchronize()

def ending():
    print(f"HOOK_EPOCH_S {time.time():.6f}", flush=True)
    if release:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    print(f"RELEASED_EPOCH_S {time.time():.6f}", flush=True)

atexit.register(ending)
"""


def one(gib: float, block_mib: int, release: bool) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(gib), str(block_mib), "1" if release else "0"],
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    reaped = time.time()
    marks = dict(line.split() for line in out.splitlines() if line.endswith(tuple("0123456789")))
    hook, released = float(marks["HOOK_EPOCH_S"]), float(marks["RELEASED_EPOCH_S"])
    return {"release": release, "end_s": reaped - hook, "release_s": released - hook, "rc": proc.returncode}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=16.0)
    p.add_argument("--block-mib", type=int, default=64)
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--json")
    args = p.parse_args()
    torch = cuda_torch_here("exit_release")
    if torch is None:
        return
    device = torch.cuda.get_device_name(0)
    one(args.gib, args.block_mib, False)  # a warm-up: the first CUDA start of the machine is slower
    runs = []
    for pair in range(args.pairs):
        for release in ((False, True) if pair % 2 == 0 else (True, False)):
            runs.append(dict(one(args.gib, args.block_mib, release), pair=pair))
    plain = [r["end_s"] for r in runs if not r["release"]]
    freed = [r["end_s"] for r in runs if r["release"]]
    paired = [b["end_s"] - a["end_s"] for a, b in zip(
        sorted((r for r in runs if not r["release"]), key=lambda r: r["pair"]),
        sorted((r for r in runs if r["release"]), key=lambda r: r["pair"]))]
    summary = {"device": device, "torch": torch.__version__, "gib": args.gib, "block_mib": args.block_mib,
               "pairs": args.pairs, "end_plain_s": statistics.median(plain), "end_release_s": statistics.median(freed),
               "release_call_s": statistics.median(r["release_s"] for r in runs if r["release"]),
               "paired_difference_s": statistics.median(paired)}
    print(f"# {device} (torch {torch.__version__}): {args.gib:g} GiB cached in {args.block_mib} MiB blocks, "
          f"{args.pairs} interleaved pairs")
    print(f"  end from the atexit hook, plain:          median {summary['end_plain_s']:.3f} s "
          f"({min(plain):.3f}-{max(plain):.3f})")
    print(f"  end from the atexit hook, with release:   median {summary['end_release_s']:.3f} s "
          f"({min(freed):.3f}-{max(freed):.3f}), of which the release {summary['release_call_s']:.3f} s")
    print(f"  release minus plain, pair by pair:        median {summary['paired_difference_s']:+.3f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
