"""Issue 57's mechanism on the CPU: how objects an agent keeps move a program's full garbage collections.

    python benchmarks/full_collection_shift.py [--steps 600]

A model program (250,000 long-lived objects, then a loop whose steps each keep 300 objects and
drop 2,000) is run in a fresh interpreter per case; a gc callback records the steps at which a
generation 2 collection ran. Cases: plain; N objects kept from the start (`early`) or from the
loop's start (`late`), as the agent's ballast is made at CUDA's start; and N objects made inside a
gc callback at the start of the first collection of generation G or older (`at-gen-G`), where the
collection then resets the count they raised. The agent's ballast is 17,408 objects (neutral.py:
BALLAST 1,024 + BULK_BALLAST 16,384). Prints one line a case; the program's own collections move
where a line differs from plain's.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

MODEL = r'''
import gc, sys
mode, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
class Slots: __slots__ = ("_",)
def tuple21(a=0): return (a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a)
B = tuple21 if mode.endswith("-tuple") else Slots
mode = mode.removesuffix("-tuple")
early = [B() for _ in range(n)] if mode == "early" else []
heap = [{"a": [i]} for i in range(250_000)]
full = []; made = []; step = 0
def cb(phase, info):
    if phase == "start" and mode.startswith("at-gen-") and not made and info["generation"] >= int(mode[-1]):
        made.extend([B() for _ in range(n)])
    if phase == "stop" and info["generation"] == 2:
        full.append(step)
gc.callbacks.append(cb)
late = [B() for _ in range(n)] if mode == "late" else []
kept = []
for step in range(steps):
    kept.append([{"x": [j]} for j in range(150)])
    junk = [[j] for j in range(2000)]
print(full)
'''

CASES = [("plain", 0), ("early", 17408), ("late", 17408), ("late", 1024), ("late", 256), ("at-gen-0", 2048),
         ("at-gen-2", 2048), ("at-gen-2", 17408),
         # the ballast the agent keeps since issue 57's fix: 21-tuples, untracked by their first collection
         ("late-tuple", 17408), ("at-gen-0-tuple", 17408)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args(argv)
    for mode, n in CASES:
        done = subprocess.run([sys.executable, "-c", MODEL, mode, str(n), str(args.steps)], capture_output=True,
                              text=True, check=True)
        print(f"{mode:>9} {n:>6} objects: full collections at steps {done.stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
