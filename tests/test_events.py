"""The agent's event helpers and its neutrality to gc (gpumemdoctor/_agent/readings/events.py, neutral.py) on
the CPU: the garbage collector's callback, holding automatic collection off, what an uncaught
exception leaves behind, and readings that leave the program's collector as they found it."""
from __future__ import annotations

import gc
import json
import os
import sys

from gpumemdoctor.recording import records
from gpumemdoctor._agent.readings import events
from gpumemdoctor._agent.neutral import NO_ROOM, Neutral, _trade, quiet_gc


class Payload:
    """Stands in for a CUDA tensor: 'allocated' goes down when it is freed."""

    allocated = 0

    def __init__(self, size):
        self.size = size
        Payload.allocated += size

    def __del__(self):
        Payload.allocated -= self.size


def _allocated(out):
    out[0] = Payload.allocated


def _collections(read, step):
    lines = []
    watch = events.Collections(Neutral(), read, 1, lines.append, lambda: step)
    watch.indexes[0] = 0
    return watch, lines


def test_a_collection_that_frees_memory_is_recorded_with_its_size_and_thread():
    watch, lines = _collections(_allocated, 7)
    watch.install()
    try:
        for _ in range(3):
            a, b = [], []
            a.append(b)
            b.append(a)
            a.append(Payload(4 << 20))  # the cycle holds 4 MiB
            del a, b
        gc.collect()
    finally:
        gc.callbacks.remove(watch.callback)
    assert watch.freeing >= 1 and watch.freed_bytes == 12 << 20
    record = json.loads(lines[-1])  # written as text: records.py checks it like any record
    records.COLLECTION(record, "collection")
    assert record["type"] == "collection" and record["step"] == 7
    assert sum(b for _, b in record["freed"]) == 12 << 20
    assert record["thread"] == "MainThread"
    assert watch.summary()["max_freed_bytes"] == 12 << 20


def test_a_collection_that_frees_nothing_is_counted_only():
    def five(out):
        out[0] = 5

    watch, lines = _collections(five, 0)
    watch.install()
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(watch.callback)
    assert lines == [] and watch.measured >= 1 and watch.freeing == 0


def test_paused_collections_are_not_measured():
    def zero(out):
        out[0] = 0

    watch, _ = _collections(zero, 0)
    watch.paused = True
    watch.install()
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(watch.callback)
    assert watch.measured == 0


def test_quiet_gc_holds_collection_off_and_restores_it():
    assert gc.isenabled()
    with quiet_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with quiet_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the program's own choice is kept
    finally:
        gc.enable()


def test_headroom_follows_the_collector_count():
    """Neutral.read(room=True) reads only with room below the collector's threshold."""
    neutral = Neutral()
    threshold = gc.get_threshold()
    try:
        gc.set_threshold(100000)
        assert neutral.read(lambda _: 7, None, room=True) == 7
        gc.set_threshold(1)
        assert neutral.read(lambda _: 7, None, room=True) is NO_ROOM
        gc.set_threshold(0)  # automatic collection off: always room
        assert neutral.read(lambda _: 7, None, room=True) == 7
    finally:
        gc.set_threshold(*threshold)


def test_uncaught_reads_what_the_interpreter_left():
    saved = getattr(sys, "last_value", None), getattr(sys, "last_exc", None)
    try:
        try:
            raise MemoryError("out of it")
        except MemoryError as exc:
            sys.last_value = exc
            if hasattr(sys, "last_exc"):
                sys.last_exc = exc
        got = events.uncaught()
        assert got["exc_type"] == "MemoryError" and got["message"] == "out of it"
        assert got["stack"][0][2] == "test_uncaught_reads_what_the_interpreter_left"
    finally:
        sys.last_value = saved[0]
        if hasattr(sys, "last_exc"):
            sys.last_exc = saved[1]


def test_program_stack_leaves_out_gpumemdoctor_frames():
    stack = events.program_stack(sys._getframe())
    assert stack[0][2] == "test_program_stack_leaves_out_gpumemdoctor_frames"
    assert all("gpumemdoctor/_agent/" not in f[0] for f in stack)


# -- neutrality: the agent's readings leave the program's collector as they found it -----------

def _nested_stats(index):
    """Shaped like torch._C._cuda_memoryStats: 39 dicts alive at once."""
    out = {"num_alloc_retries": 0}
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"):
        out[name] = {pool: {"current": 1 << 20, "peak": 2 << 20, "allocated": 3, "freed": 2}
                     for pool in ("all", "small_pool", "large_pool")}
    out["oversize_allocations"] = {"current": 0, "peak": 0}
    out["oversize_segments"] = {"current": 0, "peak": 0}
    return out


def _reserved(index):
    """What the agent does with the stats: a number out, nothing kept."""
    return _nested_stats(index)["reserved_bytes"]["all"]["current"]


def _free_dicts(limit=100):
    """How many dicts the dict free list holds (up to limit): dicts made until one is new."""
    held = []
    count = gc.get_count()[0]
    for i in range(limit):
        held.append({})
        if gc.get_count()[0] != count:
            return i
    return limit


def test_a_reading_leaves_the_count_and_the_dict_free_list_as_it_found_them():
    neutral = Neutral()
    for on_free_list in (0, 1, 5, 38, 39, 40, 42, 60, 79, 80, 0, 3):
        for read in (False, True):
            gc.disable()
            try:
                gc.collect()  # a full collection empties the free lists
                keep = [{} for _ in range(80)]
                for _ in range(on_free_list):
                    keep.pop()
                gc.get_count()  # its tuple, on its free list before the first measure
                before = gc.get_count()[0]
                if read:
                    assert neutral.read(_reserved, 0) == 1 << 20
                after = gc.get_count()[0]
                free = _free_dicts()
            finally:
                gc.enable()
            del keep
            assert (after - before, free) == (0, on_free_list), (on_free_list, read)
    assert neutral.short == 0 and len(neutral.reserve) <= neutral.lend


def _stats_and_tuples(holder):
    """A reading that also makes 30 tuples of 17 and frees them (as a first capture may): they stay
    on their own free list, which a full collection left empty, so the count rises by 30."""
    for i in range(30):
        holder[i] = tuple(range(17))
    for i in range(30):
        holder[i] = None
    return _reserved(0)


def test_tuples_a_reading_leaves_on_their_free_list_cost_their_own_ballast_only():
    """The count a reading leaves above where it began may be tuples or lists, not dicts: the dicts
    taken back are only those the dict free list holds, and the ballast pays for the tuples and one
    dict made anew (it once took back as many dicts again, all made anew, and spent twice the
    ballast: a fresh test process ran out of it at the agent's first capture and left the count
    one higher after every reading from then on)."""
    neutral = Neutral()
    gc.disable()
    try:
        gc.collect()  # empties the free lists: the tuples are made anew, and no dict is on its list
        keep = [{} for _ in range(80)]
        holder = [None] * 30
        gc.get_count()
        before = gc.get_count()[0]
        ballast = len(neutral.ballast)
        assert neutral.read(_stats_and_tuples, holder) == 1 << 20
        after = gc.get_count()[0]
        free = _free_dicts()
    finally:
        gc.enable()
    del keep
    assert (after - before, free) == (0, 0)
    assert ballast - len(neutral.ballast) == 30 + 1 and neutral.short == 0
    assert len(neutral.reserve) == neutral.lend + 1  # the dict made anew: traded for ballast later


def _capture_like(holder):
    """A peak capture's shape: the stats' 39 dicts and 15 more alive at once, and three 5-tuples."""
    stats = _nested_stats(0)
    for i in range(15):
        holder[i] = {}
    for i in range(15, 18):
        holder[i] = tuple(range(5))
    for i in range(18):
        holder[i] = None
    return stats["reserved_bytes"]["all"]["current"]


def test_captures_in_a_loop_that_keeps_its_dicts_never_run_out_of_ballast():
    """oom_accumulation.py on an H200: each capture needed 54 dicts at once, the loop took every dict
    back from the free list before the next, and the 48 lent were not enough: six dicts made anew
    and three tuples each time, the reserve grew by as many and the ballast ran out after five
    captures; from then on each capture left the collector's count higher. Now the whole reserve
    is lent (what a reading needed stays in it) and the ballast holds what 32 captures spend."""
    neutral = Neutral()
    holder, kept, spent, left_higher = [None] * 18, [], [], 0
    gc.disable()
    try:
        gc.collect()
        for _ in range(32):  # peak.py's MAX_CAPTURES
            kept.append([{} for _ in range(100)])  # the program takes every dict the free list holds
            kept.append([tuple(range(5)) for _ in range(10)])  # and the 5-tuples
            gc.get_count()
            before, ballast = gc.get_count()[0], len(neutral.ballast)
            assert neutral.read(_capture_like, holder) == 1 << 20
            left_higher += gc.get_count()[0] != before
            spent.append(ballast - len(neutral.ballast))
    finally:
        gc.enable()
    assert left_higher == 0 and neutral.short == 0
    assert max(spent[1:]) <= 3 + 1  # the tuples, and one dict made anew where the list ran out
    assert len(neutral.ballast) > neutral.lend


def test_a_dict_of_the_reserve_turns_into_ballast_only_where_the_dict_free_list_is_full():
    reserve, ballast = [{} for _ in range(4)], []
    gc.disable()
    try:
        for full in (True, False):
            keep = [{} for _ in range(200)]  # the free list's dicts taken, the rest made anew: it is empty
            if full:
                keep.clear()  # 80 of them back on the free list, the rest destroyed
            gc.get_count()
            before = gc.get_count()[0]
            _trade(reserve, ballast, gc.get_count)
            after = gc.get_count()[0]
            free = _free_dicts()
            assert after == before
            assert (len(reserve), len(ballast), free) == ((3, 1, 80) if full else (3, 1, 0)), full
            del keep
    finally:
        gc.enable()


class _Node:
    def __init__(self, parent=None):
        self.parent = parent
        self.children = []
        if parent is not None:
            parent.children.append(self)


def _cycles_program(read=None, steps=300):
    """Allocates dicts, lists and reference cycles; the collector's count after every step,
    and how many collections of each generation ran."""
    gc.collect()
    log, trace = [], []
    before = gc.get_stats()
    for step in range(steps):
        root = _Node()
        _Node(root)
        del root
        log.append([{"s": step, "i": i} for i in range((step * 7) % 50)])
        if step % 3 == 0:
            junk = [{"a": i} for i in range(step % 70)]  # fills the dict free list now and then
            del junk
        if read is not None:
            read(step)
        trace.append(gc.get_count()[0])
    after = gc.get_stats()
    return trace, [b["collections"] - a["collections"] for a, b in zip(before, after)]


def test_the_program_collects_at_the_same_moments_when_read_every_step():
    # Once, unmeasured: garbage that earlier tests of this process left is collected now, and its
    # finalizers' objects would otherwise offset the first run's counts from the next (a flaky
    # failure in -n 4 runs, every count 7 apart).
    _cycles_program()
    plain = _cycles_program()
    neutral = Neutral()

    def read(step):
        collecting = gc.isenabled()
        gc.disable()  # as on the program's thread: quiet while reading
        try:
            neutral.read(_reserved, 0)
        finally:
            if collecting:
                gc.enable()

    def bare(step):
        collecting = gc.isenabled()
        gc.disable()
        try:
            _reserved(0)
        finally:
            if collecting:
                gc.enable()

    assert _cycles_program(bare) != plain  # the reading alone moves the collector: the test can fail
    assert _cycles_program(read) == plain


def _agent_with_stand_in_torch(tmp_path):
    import types

    from gpumemdoctor._agent.core import Agent

    torch = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_memoryStats=_nested_stats),
        cuda=types.SimpleNamespace(memory_stats_as_nested_dict=_nested_stats))
    agent = Agent(str(tmp_path), 0.0)
    agent.shared.torch = torch
    agent.shared.devices = [{"index": 0, "uuid": "GPU-0", "pci_bus_id": None, "name": "stand-in", "nvml_device": None}]
    agent.prepare_reading()
    agent.attach_observers()  # the collector's callback; PyTorch's out-of-memory observer is absent here
    return agent


def test_the_agents_samples_and_collection_callback_leave_the_collector_alone(tmp_path, monkeypatch):
    from gpumemdoctor._agent.readings import sampler

    monkeypatch.setattr(sampler, "SAMPLE_SHARE", 1e9)  # paced all the same, but every step is sampled
    _cycles_program()  # unmeasured, as above
    plain = _cycles_program()
    agent = _agent_with_stand_in_torch(tmp_path)
    try:
        def read(step):
            agent.on_step(False)  # a step sample, on the program's thread
            if step % 5 == 0:
                agent.sampler.sample("time")  # what the sampling thread does, here at known moments
        measured = _cycles_program(read)
    finally:
        gc.callbacks.remove(agent.collections.callback)
        os.close(agent.shared.channel.fd)
    assert agent.sampler.samples > 300 and agent.collections.measured >= 10
    assert measured[1] == plain[1]  # as many collections of each generation
    if sys.version_info[:2] in ((3, 11), (3, 12)):  # where it was measured (CI's and the GPU machines')
        assert measured[0] == plain[0]  # and each at the same moment
    lines = (tmp_path / f"agent-{os.getpid()}.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines if '"type":"s"' in line]
    assert samples[0]["d"] == [[0, 1 << 20, 1 << 20, 1 << 20, 1 << 20, None, 2 << 20, 2 << 20]]
    assert {s["by"] for s in samples} == {"step", "time"}
