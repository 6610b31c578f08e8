"""What the readings' ballast costs the collection that makes it: a young collection started by the
program (gc.collect(0) here), with the agent's collector callback topping a Bulk up from empty
(neutral.top_up: its first top-up makes all BULK_BALLAST at once) and with nothing to make; medians
of interleaved runs. CPU only: run it on the GPU machine's host, where the programs run.

    python3 benchmarks/ballast_cost.py [--runs 21]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

from gpumemdoctor._agent.neutral import BULK_BALLAST, TOPUP_MAX, Bulk, top_up


def _collection(bulk) -> float:
    """One young collection with a callback that tops `bulk` up at its start: its seconds."""
    def callback(phase, info):
        if phase == "start" and bulk is not None:
            top_up(bulk)

    gc.callbacks.append(callback)
    try:
        started = time.perf_counter()
        gc.collect(0)
        return time.perf_counter() - started
    finally:
        gc.callbacks.remove(callback)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    first, later, none = [], [], []
    for _ in range(args.runs):
        none.append(_collection(None))
        bulk = Bulk(ballast=0)
        first.append(_collection(bulk))  # the first top-up: all of it
        del bulk.ballast[:TOPUP_MAX]
        later.append(_collection(bulk))  # a later one: TOPUP_MAX
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    print(f"young collection alone:              {ms(none):.3f} ms")
    print(f"with the first top-up ({BULK_BALLAST} ballast): {ms(first):.3f} ms (+{ms(first) - ms(none):.3f})")
    print(f"with a later top-up ({TOPUP_MAX} ballast):   {ms(later):.3f} ms (+{ms(later) - ms(none):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
