"""How long one step pauses for a reading's walk, whole against in parts (issue 57).

A reading's walk (history.py: replay.Walk, then the snapshot let go) ran whole at one step's sample:
GPT-2 124M's 4,767 entries paused a step 4.4 ms on an H200 (3.1 ms the walk, 1.3 ms letting go). It
now goes on at each step sample for WALK_SLICE_S. This walks a trace whole and in parts, medians of
`--repeat`, and prints the whole walk's time, the longest part's and how many parts it took; no GPU
needed. The trace: GPT-2 124M's last `--entries` recorded on an H100
(tests/fixtures/history/gpt2-124m-h100.json.gz, four AdamW steps), or with `--made-up` a made-up one
of a training step's shape (activations made in a forward and freed in its backward, temporaries,
gradients).

    python3 benchmarks/walk_parts.py --entries 4767
    python3 benchmarks/walk_parts.py --made-up --steps 2 --activations 800
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path

from gpumemdoctor._agent.peak import reading, replay
from gpumemdoctor._agent.peak.history import WALK_SLICE_S


GPT2 = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "history" / "gpt2-124m-h100.json.gz"
MARK_KINDS = {"backward": replay.BACKWARD, "backward_end": replay.BACKWARD_END, "step": replay.STEP,
              "step_end": replay.STEP_END}


def recorded_trace(entries: int) -> tuple[list, list, list]:
    """GPT-2's last `entries` entries, as PyTorch's snapshot gives them, and the marks."""
    with gzip.open(GPT2, "rt") as f:
        d = json.load(f)
    trace = [{"action": a, "addr": addr, "size": size, "time_us": t, "stream": 0, "frames": []}
             for a, addr, size, t in d["trace"][-entries:]]
    times = [t for k, t in d["marks"] if k in MARK_KINDS]
    kinds = [MARK_KINDS[k] for k, t in d["marks"] if k in MARK_KINDS]
    return trace, times, kinds


def made_up_trace(steps: int, activations: int) -> tuple[list, list, list]:
    """Entries of `steps` training steps (oldest first) and their marks."""
    trace: list = []
    times: list = []
    kinds: list = []
    us = 0
    for _ in range(steps):
        live = []
        for k in range(activations):
            us += 10
            a = (1 << 40) + k * (1 << 24)
            trace.append({"action": "alloc", "addr": a, "size": 4 << 20, "time_us": us, "stream": 0, "frames": []})
            live.append(a)
            if k % 2 == 0:  # a temporary of the forward
                b = a + (1 << 36)
                trace.append({"action": "alloc", "addr": b, "size": 1 << 20, "time_us": us + 1, "stream": 0,
                              "frames": []})
                trace.append({"action": "free_requested", "addr": b, "size": 1 << 20, "time_us": us + 2,
                              "stream": 0, "frames": []})
        us += 5
        times.append(us)
        kinds.append(replay.BACKWARD)
        for a in reversed(live):
            us += 10
            g = a + (1 << 35)
            trace.append({"action": "alloc", "addr": g, "size": 2 << 20, "time_us": us, "stream": 0, "frames": []})
            trace.append({"action": "free_requested", "addr": g, "size": 2 << 20, "time_us": us + 1, "stream": 0,
                          "frames": []})
            trace.append({"action": "free_requested", "addr": a, "size": 4 << 20, "time_us": us + 2, "stream": 0,
                          "frames": []})
        for mark in (replay.BACKWARD_END, replay.STEP, replay.STEP_END):
            us += 5
            times.append(us)
            kinds.append(mark)
    return trace, times, kinds


def parts(make, slice_s: float) -> tuple[float, float, int]:
    """(all parts' time, the longest part's, how many parts): the walk, then the entries let go by
    reading.py's own `_let_go` (a reading made at once's: no ballast to lift, no Bulk run around it)."""
    trace, times, kinds = make()
    taken = [None] * (reading.OPTIMIZERS + 1)
    taken[reading.TRACE] = trace
    walk = replay.Walk(trace, 10 << 30, times, kinds, {}, {}, 12 << 30, None)
    del trace
    spent = []
    while True:
        started = time.perf_counter()
        deadline = started + slice_s
        if walk is not None and walk.run(deadline):
            walk = None  # (its result kept; what it held of the entries let go with it)
        gone = walk is None and reading._let_go(None, taken, False, deadline)
        spent.append(time.perf_counter() - started)
        if gone:
            return sum(spent), max(spent), len(spent)


def whole(make) -> tuple[float, int]:
    """The walk and the letting go at once: (its time, the trace's entries)."""
    trace, times, kinds = make()
    entries = len(trace)
    started = time.perf_counter()
    replay.replay(trace, 10 << 30, times, kinds, {}, {}, 12 << 30, None)
    trace.clear()
    return time.perf_counter() - started, entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=4767, help="of GPT-2's recorded trace, the last ones")
    parser.add_argument("--made-up", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--activations", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    if args.made_up:
        def make():
            return made_up_trace(args.steps, args.activations)
    else:
        def make():
            return recorded_trace(args.entries)
    at_once, longest, count = [], [], []
    entries = 0
    for _ in range(args.repeat):
        spent, entries = whole(make)
        at_once.append(spent)
        _, most, n = parts(make, WALK_SLICE_S)
        longest.append(most)
        count.append(n)
    print(f"{'made-up' if args.made_up else 'GPT-2'}, {entries} entries: the whole walk and letting go {statistics.median(at_once) * 1e3:.2f} ms at one step; "
          f"in parts of {WALK_SLICE_S * 1e3:.1f} ms: the longest {statistics.median(longest) * 1e3:.2f} ms, "
          f"{statistics.median(count):.0f} parts (medians of {args.repeat})")


if __name__ == "__main__":
    main()
