"""What PyTorch's allocation history alone adds to a launch-bound program's steps, without this tool:
`corpus/lightning_clean.py` (a Lightning fit of 300 steps of 3-4 ms) run plain, with the history of
events the agent keeps from CUDA's start (`events`: enabled="all", context=None, the entries it skips
left out), and with the live blocks' Python stacks recorded as well (`stacks`: context="state", what
--trace auto's windows switch on), in interleaved rounds. Each run's step times go to DIR.

    python3 benchmarks/history_modes.py --rounds 2 --out DIR
"""
from __future__ import annotations

import argparse
import os
import runpy
import statistics
import subprocess
import sys

from _loop import cuda_torch_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("plain", "events", "stacks")
SKIP_EXIT = 77


def _inside(mode: str) -> None:
    """The measured program, in this process: the history as `mode` asks, then the corpus program."""
    script = os.path.join(ROOT, "corpus", "lightning_clean.py")
    sys.argv = [script]
    sys.path.insert(0, os.path.join(ROOT, "corpus"))
    if mode != "plain":
        import torch

        sys.path.insert(0, ROOT)
        from gpumemdoctor._agent.peak import history  # (the agent's ring: its smallest size and skipped entries)

        entries = history.capacity(history.MIN_EVENTS, True)
        torch.cuda.memory._record_memory_history(enabled="all", context=None if mode == "events" else "state",
                                                 stacks="python", max_entries=entries, skip_actions=history.SKIPPED)
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--inside", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside:
        _inside(args.inside)
        return 0
    if cuda_torch_here("history_modes") is None:
        return 0
    os.makedirs(args.out, exist_ok=True)
    for r in range(1, args.rounds + 1):
        for mode in MODES:
            times = os.path.join(args.out, f"{mode}-{r}.txt")
            proc = subprocess.run([sys.executable, __file__, "--inside", mode, "--out", args.out], capture_output=True,
                                  text=True, env={**os.environ, "CORPUS_STEP_TIMES": times}, timeout=300)
            if proc.returncode == SKIP_EXIT:  # (corpus/_common.py: a library it needs is missing)
                print(f"history_modes: skipped: {proc.stderr.strip()[-200:]}")
                return 0
            if proc.returncode != 0:
                print(f"history_modes: the {mode} run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}",
                      file=sys.stderr)
                return 1
            figures = [line for line in proc.stdout.splitlines() if line.startswith(("STEP_TIME_MS", "STEP_GAP_MAX_MS"))]
            print(mode, r, " ".join(figures), flush=True)
    for mode in MODES:
        for r in range(1, args.rounds + 1):
            path = os.path.join(args.out, f"{mode}-{r}.txt")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                v = [float(line) for line in f if line.strip()]
            big = sorted(range(len(v)), key=lambda i: -v[i])[:5]
            print(f"{mode}-{r}: {len(v)} steps, median {statistics.median(v):.2f} ms, longest (step, ms) "
                  f"{[(i, round(v[i], 1)) for i in big]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
