"""The agent's ballast leaves the program's full collections where they were (issue 57).

A Lightning loop on an H200 stalled 0.3 s under the tool: its own collection of generation 2, which
the agent's 17,408 tracked ballast objects, made at CUDA's start, had brought 24 steps earlier, into
the loop. The ballast is now made of 21-tuples (ballast_item: untracked by their first collection)
and made at collections' starts (neutral.top_up, from the agent's collector callback). How that keeps
a program's full collections where they were is shown on a model program by
benchmarks/full_collection_shift.py (its results in benchmarks/results/).
"""
from __future__ import annotations

import gc
import os
import sys

import pytest

from gpumemdoctor._agent.neutral import BALLAST, BULK_BALLAST, BULK_SPARE, HELD_SPARE, TOPUP_MAX, Bulk, Neutral, ballast_item, top_up

def _stand_in_agent(tmp_path):
    import types

    from gpumemdoctor._agent.core import Agent

    def nested(index):
        out = {"num_alloc_retries": 0}
        for name in ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes", "active_bytes"):
            out[name] = {p: {"current": 1 << 20, "peak": 2 << 20} for p in ("all", "small_pool", "large_pool")}
        return out

    agent = Agent(str(tmp_path), 0.0)
    agent.shared.torch = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_memoryStats=nested),
                                               cuda=types.SimpleNamespace(memory_stats_as_nested_dict=nested))
    agent.shared.devices = [{"index": 0, "uuid": "GPU-0", "pci_bus_id": None, "name": "stand-in", "nvml_device": None}]
    return agent


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.parametrize("kind", ["tuple", "tracked"])
def test_the_agents_ballast_is_made_at_collections_and_joins_no_generation(tmp_path, monkeypatch, kind):
    """Under `run` the ballast (17,408 objects) is made at collections' starts and no generation
    holds it: what the agent adds to the collector's generations at CUDA's start is its own few
    hundred rows and lists. With ballast that stays tracked (the kind before issue 57's fix) the
    generations grow by all of it: the test can fail."""
    from gpumemdoctor._agent import neutral

    if kind == "tracked":
        class Slots:
            __slots__ = ("_",)
        monkeypatch.setattr(neutral, "ballast_item", Slots)
    agent = _stand_in_agent(tmp_path)
    try:
        before = _tracked()
        agent.prepare_reading()
        agent.attach_observers()
        assert len(agent.sampler.neutral.ballast) == 0 and len(agent.history.bulk.ballast) == 0  # none made yet
        for _ in range((BALLAST + BULK_BALLAST) // TOPUP_MAX + 2):
            gc.collect(0)  # each collection's start makes up to TOPUP_MAX
        # (at least: the collector callback's own readings make a little more where they lower the count;
        # Python 3.12 on the H200: 1,056)
        assert len(agent.sampler.neutral.ballast) >= BALLAST and len(agent.history.bulk.ballast) == BULK_BALLAST
        added = _tracked() - before
    finally:
        gc.callbacks.remove(agent.collections.callback)
        os.close(agent.shared.channel.fd)
    if kind == "tracked":
        assert added >= BALLAST + BULK_BALLAST
    else:
        assert added < 1000, added


def test_a_ballast_moves_the_count_by_one_each_way_and_is_untracked_by_a_collection():
    was = gc.isenabled()
    gc.disable()
    try:
        c = gc.get_count()[0]
        items = [ballast_item() for _ in range(100)]
        made = gc.get_count()[0] - c
        assert made in (100, 101)  # (and the list, where none was free)
        assert all(gc.is_tracked(x) for x in items)
        gc.collect(0)
        assert not any(gc.is_tracked(x) for x in items)  # no generation holds them from here on
        pad = [ballast_item() for _ in range(300)]  # the count well above what freeing the 100 takes away
        c = gc.get_count()[0]
        del items[:]
        assert c - gc.get_count()[0] == 100  # untracked, each still lowers the count as it is freed
        del pad
    finally:
        if was:
            gc.enable()


def test_top_up_makes_at_most_its_share_at_a_time_up_to_the_target():
    neutral, bulk = Neutral(ballast=0), Bulk(ballast=0)
    assert not bulk.ready()  # a bulk reading waits for its ballast
    assert top_up(neutral) == BALLAST and top_up(neutral) == 0
    made = [top_up(bulk) for _ in range(BULK_BALLAST // TOPUP_MAX + 2)]
    # The first makes all of it at once (a program may collect twice in its run), later ones what
    # readings spent, TOPUP_MAX at a time.
    assert made[0] == BULK_BALLAST and sum(made) == BULK_BALLAST and made[-1] == 0
    assert bulk.ready() and bulk.can_hold(BULK_BALLAST - BULK_SPARE - HELD_SPARE)
    del bulk.ballast[:TOPUP_MAX + 10]
    assert top_up(bulk) == TOPUP_MAX and top_up(bulk) == 10 and top_up(bulk) == 0
    full = Bulk()  # made with its ballast (not under `run`): its first top-up is no larger than later ones
    assert top_up(full) == 0
    del full.ballast[:TOPUP_MAX + 10]
    assert top_up(full) == TOPUP_MAX
