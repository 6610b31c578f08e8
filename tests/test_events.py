"""The agent's event helpers (gpumemdoctor/_events.py) on the CPU: the garbage collector's
callback, holding automatic collection off, and what an uncaught exception leaves behind."""
from __future__ import annotations

import gc
import sys

from gpumemdoctor import _events


class Payload:
    """Stands in for a CUDA tensor: 'allocated' goes down when it is freed."""

    allocated = 0

    def __init__(self, size):
        self.size = size
        Payload.allocated += size

    def __del__(self):
        Payload.allocated -= self.size


def test_a_collection_that_frees_memory_is_recorded_with_its_size_and_thread():
    written = []
    watch = _events.Collections(lambda: {0: Payload.allocated}, written.append, lambda: 7)
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
    record = written[-1]
    assert record["type"] == "collection" and record["step"] == 7
    assert sum(b for _, b in record["freed"]) == 12 << 20
    assert record["thread"] == "MainThread"
    assert watch.summary()["max_freed_bytes"] == 12 << 20


def test_a_collection_that_frees_nothing_is_counted_only():
    written = []
    watch = _events.Collections(lambda: {0: 5}, written.append, lambda: 0)
    watch.install()
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(watch.callback)
    assert written == [] and watch.measured >= 1 and watch.freeing == 0


def test_paused_collections_are_not_measured():
    watch = _events.Collections(lambda: {0: 0}, lambda r: None, lambda: 0)
    watch.paused = True
    watch.install()
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(watch.callback)
    assert watch.measured == 0


def test_quiet_gc_holds_collection_off_and_restores_it():
    assert gc.isenabled()
    with _events.quiet_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with _events.quiet_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the program's own choice is kept
    finally:
        gc.enable()


def test_headroom_follows_the_collector_count():
    threshold = gc.get_threshold()
    try:
        gc.set_threshold(100000)
        assert _events.gc_headroom()
        gc.set_threshold(1)
        assert not _events.gc_headroom() or gc.get_count()[0] + _events.GC_HEADROOM < 1
        gc.set_threshold(0)  # automatic collection off: always room
        assert _events.gc_headroom()
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
        got = _events.uncaught()
        assert got["exc_type"] == "MemoryError" and got["message"] == "out of it"
        assert got["stack"][0][2] == "test_uncaught_reads_what_the_interpreter_left"
    finally:
        sys.last_value = saved[0]
        if hasattr(sys, "last_exc"):
            sys.last_exc = saved[1]


def test_program_stack_leaves_out_gpumemdoctor_frames():
    stack = _events.program_stack(sys._getframe())
    assert stack[0][2] == "test_program_stack_leaves_out_gpumemdoctor_frames"
    assert all("gpumemdoctor/_events.py" not in f[0] for f in stack)
