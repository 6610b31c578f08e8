"""Freed blocks held for stream work at exit (issue 42): the agent's `pending` record
(_agent/readings/streams.py) on a stand-in allocator, and how the diagnosis reads it (diagnosis/streams.py,
the judgement's row 15). The figures here are made up for the logic; the recordings that show it on
a GPU are tests/fixtures/reports/pending_stream.json and the clean_* ones named in the GPU tests."""
from __future__ import annotations

import sys
import types

import pytest

from gpumemdoctor._agent.readings import streams as agent_streams
from gpumemdoctor.diagnosis import judgement, streams
from gpumemdoctor.diagnosis.evidence import Evidence

MIB = 1 << 20


class Allocator:
    """Stands in for PyTorch's: blocks freed for a stream stay active until an allocation processes
    their events, and only once that stream's work is done."""

    def __init__(self, allocated: int, finished: int, unfinished: int, stream: int = 0x5A5A):
        self.allocated, self.finished, self.unfinished, self.stream = allocated, finished, unfinished, stream
        self.work_done = False
        self.allocations = 0

    def stats(self, index: int) -> dict:
        active = self.allocated + self.finished + self.unfinished
        return {"active_bytes": {"all": {"current": active}}, "allocated_bytes": {"all": {"current": self.allocated}}}

    def allocate(self) -> None:
        self.allocations += 1
        self.finished = 0
        if self.work_done:
            self.unfinished = 0

    def torch(self):
        alloc = self

        class Stream:
            def __init__(self, handle):
                self.cuda_stream, self.device_index = handle, 0

            def query(self):
                return alloc.work_done or self.cuda_stream != alloc.stream

            def synchronize(self):
                if self.cuda_stream == alloc.stream:
                    alloc.work_done = True

        cuda = types.SimpleNamespace(Stream=Stream,
                                     synchronize=lambda index=None: setattr(alloc, "work_done", True))
        return types.SimpleNamespace(cuda=cuda, empty=lambda *a, **k: alloc.allocate())


def settle(alloc: Allocator, monkeypatch=None, main_globals: dict | None = None) -> list[dict]:
    torch = alloc.torch()
    if main_globals is not None:
        main = types.ModuleType("__main__")
        main.__dict__.update({k: (torch.cuda.Stream(v) if isinstance(v, int) else v) for k, v in main_globals.items()})
        monkeypatch.setitem(sys.modules, "__main__", main)
    out: list[dict] = []
    agent_streams.settle(torch, alloc.stats, [0], out.append)
    return out


def test_finished_work_is_released_by_one_allocation_and_nothing_is_waited_for():
    alloc = Allocator(allocated=100 * MIB, finished=1024 * MIB, unfinished=0)
    (record,) = settle(alloc)
    assert (record["before_bytes"], record["unfinished_bytes"]) == (1024 * MIB, 0)
    assert record["streams"] == [] and record["wait_s"] is None and alloc.allocations == 1


def test_unfinished_work_is_named_by_its_stream_and_waited_for(monkeypatch):
    alloc = Allocator(allocated=0, finished=64 * MIB, unfinished=1024 * MIB)
    (record,) = settle(alloc, monkeypatch, {"side": 0x5A5A, "other": 7})
    assert record["unfinished_bytes"] == 1024 * MIB and record["after_sync_bytes"] == 0
    (handle, size, name, waited), = record["streams"]
    assert (handle, size, name) == (0x5A5A, 1024 * MIB, "side") and waited >= 0
    assert record["wait_s"] is not None


def test_work_on_a_stream_the_program_does_not_name_is_waited_for_on_the_device(monkeypatch):
    alloc = Allocator(allocated=0, finished=0, unfinished=512 * MIB)
    (record,) = settle(alloc, monkeypatch, {"other": 7})
    (handle, size, name, waited), = record["streams"]
    assert (handle, size, name) == (-1, 512 * MIB, None) and waited == record["wait_s"]
    words = streams.stream_words(record)
    assert words.startswith("streams the program's main module does not name (512 MiB, finished ")


def test_no_record_where_nothing_is_held_for_a_stream():
    assert settle(Allocator(allocated=5 * MIB, finished=0, unfinished=0)) == []


def test_a_failure_is_an_error_record_never_an_exception():
    out: list[dict] = []
    agent_streams.settle(types.SimpleNamespace(), lambda i: {}, [0], out.append)
    assert out[0]["type"] == "error" and out[0]["where"] == "pending streams"


def evidence(pending_bytes: int, told: dict) -> Evidence:
    e = Evidence(pid=1, device=0, torch_index=0, where="process 1 on GPU 0", samples=50, by="step",
                 enough_samples=True, unseen_bytes=0, growth=None, live_bytes=0, garbage_bytes=0)
    e.pending_stream_bytes, e.pending = pending_bytes, told
    return e


def rows(e: Evidence) -> list[str]:
    return [j.kind for j in judgement.judge(e)]


def test_pending_stream_needs_work_that_ran_on_past_the_end():
    record = {"device": 0, "before_bytes": 1024 * MIB, "unfinished_bytes": 1024 * MIB, "wait_s": 1.9,
              "streams": [[0x5A5A, 1024 * MIB, "side", 1.9]], "after_sync_bytes": 0}
    (found,) = [j for j in judgement.judge(evidence(1024 * MIB, streams.evidence(record)))
                if j.kind == "pending-stream"]
    assert "side stream `side` (1.00 GiB, finished 1.90 s after the end)" in found.summary
    assert found.evidence["decided_by"] == "unfinished-work"
    quick = dict(record, wait_s=0.004)  # the last step's own work, done 4 ms after the end
    assert "pending-stream" not in rows(evidence(1024 * MIB, streams.evidence(quick)))


def test_finished_work_is_cache_with_a_note_and_no_finding():
    record = {"device": 0, "before_bytes": 10 << 30, "unfinished_bytes": 0, "wait_s": None, "streams": [],
              "after_sync_bytes": None}
    assert streams.held_bytes(record, 10 << 30) == 0
    assert "10.0 GiB freed" in streams.note("rank 0 (process 1) on GPU 0", record)
    assert "pending-stream" not in rows(evidence(0, streams.evidence(record)))


def test_an_older_recording_counts_the_whole_gap_and_says_it_could_not_tell():
    assert streams.held_bytes(None, 1024 * MIB) == 1024 * MIB and streams.note("x", None) is None
    (found,) = [j for j in judgement.judge(evidence(1024 * MIB, streams.evidence(None)))
                if j.kind == "pending-stream"]
    assert "does not tell unfinished work" in found.summary and found.evidence["decided_by"] == "active-at-end"


@pytest.mark.parametrize("waited", [0.0999, 0.1])
def test_the_wait_threshold(waited):
    record = {"device": 0, "before_bytes": 128 * MIB, "unfinished_bytes": 128 * MIB, "wait_s": waited,
              "streams": [], "after_sync_bytes": 0}
    assert ("pending-stream" in rows(evidence(128 * MIB, streams.evidence(record)))) is (waited >= 0.1)
