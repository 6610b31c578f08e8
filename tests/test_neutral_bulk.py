"""A bulk reading (neutral.Bulk: PyTorch's allocator snapshot, thousands of dicts, lists and
2-tuples) leaves the collector's count and the free lists of those types as it found them."""
from __future__ import annotations

import gc
import sys

import pytest

from gpumemdoctor._agent.neutral import BULK_SPARE, Bulk, checked_run


def _snapshot_like(sizes):
    """What a snapshot makes: `dicts` dicts in lists, `pairs` 2-tuples, all freed at the end."""
    dicts, lists, pairs = sizes
    trace = [{"action": "alloc", "addr": i, "size": 512} for i in range(dicts)]
    segments = [[{"a": i}] for i in range(lists)]
    pools = [(i, i + 1) for i in range(pairs)]
    return len(trace) + len(segments) + len(pools)


@pytest.mark.parametrize("sizes", [(0, 0, 0), (5, 3, 1), (79, 81, 10), (5000, 800, 198), (40, 2000, 3000)])
def test_a_bulk_reading_leaves_the_count_and_the_free_lists_as_they_were(sizes):
    bulk = Bulk()
    was = gc.isenabled()
    gc.disable()
    # No other thread runs in between (one left by an earlier test, in this process, would make and
    # free objects of its own): a reading holds the GIL throughout, as this test does.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        # Free lists part full, as in a running program.
        junk = [{} for _ in range(30)] + [[] for _ in range(20)] + [(i, -i) for i in range(500)]
        del junk
        before, after = [], []
        made, c0, c1 = checked_run(bulk, _snapshot_like, sizes, before, after)
    finally:
        sys.setswitchinterval(interval)
        if was:
            gc.enable()
    assert made == sum(sizes)
    assert c1 == c0
    assert after == before
    assert bulk.short == 0


def test_the_ballast_says_when_another_reading_could_not_be_put_back():
    bulk = Bulk()
    assert bulk.ready()
    del bulk.ballast[BULK_SPARE - 1:]
    assert not bulk.ready()


def test_a_snapshot_kept_until_a_later_step_leaves_each_run_as_it_found_things():
    """reading.py keeps a snapshot's entries from one step's sample to the next: the run that takes
    them pops ballast for each, the run that lets them go makes it again; each leaves the count and
    the free lists as they were, and the ballast is ready for the next reading."""
    from gpumemdoctor._agent.neutral import BULK_BALLAST

    bulk = Bulk()
    kept: list = []

    def take(n):
        kept.append([{"action": "alloc", "addr": i, "size": 512} for i in range(n)])

    def let_go(_):
        bulk.lift(len(kept[0]) + 1)
        del kept[:]

    was = gc.isenabled()
    gc.disable()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        junk = [{} for _ in range(30)] + [[] for _ in range(20)] + [(i, -i) for i in range(500)]
        del junk
        assert bulk.can_hold(11_500) and not bulk.can_hold(BULK_BALLAST)
        ballast = len(bulk.ballast)
        runs = []
        for fn, arg in ((take, 11_500), (let_go, None)):
            before, after = [], []
            _, c0, c1 = checked_run(bulk, fn, arg, before, after)
            runs.append((c0, c1, before, after, len(bulk.ballast)))
    finally:
        sys.setswitchinterval(interval)
        if was:
            gc.enable()
    (c0, c1, before, after, left), (d0, d1, before2, after2, back) = runs
    assert c1 == c0 and after == before
    assert d1 == d0 and after2 == before2
    assert left <= ballast - 11_500 and bulk.short == 0
    assert back >= ballast - 600 and bulk.ready()  # (less what refilled the free lists, kept)
