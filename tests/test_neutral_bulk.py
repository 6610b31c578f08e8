"""A bulk reading (neutral.Bulk: PyTorch's allocator snapshot, thousands of dicts, lists and
2-tuples) leaves the collector's count and the free lists of those types as it found them.

Each measure runs in a fresh interpreter: in the test process, a thread or a pending call left by
an earlier test (an agent's) can make dicts, lists and tuples in the middle of a measure."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpumemdoctor._agent.neutral import BULK_BALLAST, BULK_SPARE, Bulk, checked_run

ROOT = Path(__file__).parent.parent


def _snapshot_like(sizes):
    """What a snapshot makes: `dicts` dicts in lists, `pairs` 2-tuples, all freed at the end."""
    dicts, lists, pairs = sizes
    trace = [{"action": "alloc", "addr": i, "size": 512} for i in range(dicts)]
    segments = [[{"a": i}] for i in range(lists)]
    pools = [(i, i + 1) for i in range(pairs)]
    return len(trace) + len(segments) + len(pools)


def _quiet(measure):
    """measure() with collection held off and no switch to another thread, as a reading holds the GIL."""
    was = gc.isenabled()
    gc.disable()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        # Free lists part full, as in a running program.
        junk = [{} for _ in range(30)] + [[] for _ in range(20)] + [(i, -i) for i in range(500)]
        del junk
        return measure()
    finally:
        sys.setswitchinterval(interval)
        if was:
            gc.enable()


def one_reading(sizes) -> dict:
    bulk = Bulk()

    def measure():
        before, after = [], []
        made, c0, c1 = checked_run(bulk, _snapshot_like, sizes, before, after)
        return {"made": made, "c0": c0, "c1": c1, "before": before, "after": after}

    out = _quiet(measure)
    out["short"] = bulk.short
    return out


def kept_then_let_go(n: int) -> dict:
    """reading.py's two runs: one keeps n dicts (a snapshot's entries), a later one lets them go."""
    bulk = Bulk()
    kept: list = []

    def take(count):
        kept.append([{"action": "alloc", "addr": i, "size": 512} for i in range(count)])

    def let_go(_):
        bulk.lift(len(kept[0]) + 1)
        del kept[:]

    def measure():
        ballast = len(bulk.ballast)
        runs = []
        for fn, arg in ((take, n), (let_go, None)):
            before, after = [], []
            _, c0, c1 = checked_run(bulk, fn, arg, before, after)
            runs.append({"c0": c0, "c1": c1, "before": before, "after": after, "ballast": len(bulk.ballast)})
        return {"ballast": ballast, "runs": runs}

    out = _quiet(measure)
    out.update(short=bulk.short, ready=bulk.ready())
    return out


def _fresh(call: str) -> dict:
    code = f"import json; from tests.test_neutral_bulk import *; print(json.dumps({call}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("sizes", [(0, 0, 0), (5, 3, 1), (79, 81, 10), (5000, 800, 198), (40, 2000, 3000)])
def test_a_bulk_reading_leaves_the_count_and_the_free_lists_as_they_were(sizes):
    r = _fresh(f"one_reading({list(sizes)!r})")
    assert r["made"] == sum(sizes)
    assert r["c1"] == r["c0"]
    assert r["after"] == r["before"]
    assert r["short"] == 0


def test_the_ballast_says_when_another_reading_could_not_be_put_back():
    bulk = Bulk()
    assert bulk.ready()
    del bulk.ballast[BULK_SPARE - 1:]
    assert not bulk.ready()


def test_a_snapshot_kept_until_a_later_step_leaves_each_run_as_it_found_things():
    """reading.py keeps a snapshot's entries from one step's sample to the next: the run that takes
    them pops ballast for each, the run that lets them go makes it again (Bulk.lift: CPython stops
    counting frees at zero); each leaves the count and the free lists as they were, and the ballast
    is ready for the next reading."""
    bulk = Bulk()
    assert bulk.can_hold(11_500) and not bulk.can_hold(BULK_BALLAST)
    r = _fresh("kept_then_let_go(11_500)")
    take, let_go = r["runs"]
    assert take["c1"] == take["c0"] and take["after"] == take["before"]
    assert let_go["c1"] == let_go["c0"] and let_go["after"] == let_go["before"]
    assert take["ballast"] <= r["ballast"] - 11_500 and r["short"] == 0
    assert let_go["ballast"] >= r["ballast"] - 600 and r["ready"]  # (less what refilled the free lists, kept)
