"""The decision table (gpumemdoctor/diagnosis/judgement.py), row by row, on evidence built here.

These are unit tests of the rules; the recordings in tests/fixtures/reports (real GPU runs)
check the same judgement end to end in tests/test_diagnosis.py.
"""
from __future__ import annotations

from gpumemdoctor.diagnosis import judgement
from gpumemdoctor.diagnosis.diagnose import Finding, choose_verdict

MIB = 1 << 20


def evidence(**kw) -> judgement.Evidence:
    base = dict(pid=10, device=0, torch_index=0, where="process 10 on GPU 0", samples=3, by="time",
                enough_samples=False, unseen_bytes=0, growth=None, live_bytes=0, garbage_bytes=0,
                exited_normally=True)
    base.update(kw)
    return judgement.Evidence(**base)


def held(count=40, size=64 * MIB, pattern="__main__.errors[*].__traceback__", kind="kept-exception"):
    return {"pattern": pattern, "path": pattern.replace("*", "39"), "kind": kind, "count": count,
            "bytes": count * size, "sizes": [[size, count]], "where": None, "thread": None}


def unheld(count=40, size=64 * MIB, why=None, graph_grads=None):
    return {"count": count, "bytes": count * size, "sizes": [[size, count]], "where": None,
            "thread": None, "same_line": False, "why": why, "graph_grads": graph_grads}


def oom(**kw):
    base = {"t": 1.0, "step": 3, "device": 0, "request_bytes": 1024 * MIB, "limit_bytes": 80 * 1024 * MIB,
            "device_free_bytes": 100 * MIB, "allocated_bytes": 79 * 1024 * MIB,
            "reserved_bytes": 79 * 1024 * MIB, "active_bytes": 79 * 1024 * MIB,
            "largest_free_block_bytes": 0, "free_in_segments_bytes": 0, "processes": [[10, 80 * 1024 * MIB]],
            "thread": "MainThread", "stack": [["/work/train.py", 12, "step"]]}
    base.update(kw)
    return base


def kinds(found):
    return [(j.kind, j.evidence.get("decided_by")) for j in found]


def test_too_short_to_watch_and_an_accumulation_is_a_leak_by_structure():
    found = judgement.judge(evidence(accumulations=[held()], live_bytes=40 * 64 * MIB))
    assert kinds(found) == [("leak", "structure")]
    assert "too short to see growth over time (3 samples" in found[0].summary
    assert found[0].bytes == 40 * 64 * MIB
    assert found[0].suspects[0]["holders"][0]["pattern"] == "__main__.errors[*].__traceback__"
    assert "40 tensors of 64.0 MiB each" in found[0].suspects[0]["summary"]


def test_enough_samples_and_no_growth_is_not_a_leak_even_with_an_accumulation():
    found = judgement.judge(evidence(enough_samples=True, samples=300, accumulations=[held()],
                                     live_bytes=40 * 64 * MIB))
    assert kinds(found) == [("live-at-exit", "exit")]
    assert "did not keep growing while the program was watched" in found[0].summary


def test_a_small_accumulation_decides_nothing():
    found = judgement.judge(evidence(accumulations=[held(count=8, size=1 * MIB)], live_bytes=8 * MIB))
    assert found == []


def test_growth_seen_over_time_decides_first():
    growth = {"series": "allocated", "by": "step", "grown_bytes": 800 * MIB, "retained_bytes": 790 * MIB,
              "rate_text": "8.00 MiB per step (from step 11)"}
    found = judgement.judge(evidence(enough_samples=True, samples=120, growth=growth,
                                     accumulations=[held()], live_bytes=900 * MIB))
    assert kinds(found) == [("leak", "growth")]


def test_unheld_alike_allocations_in_a_short_run_are_a_leak_with_the_create_graph_remedy():
    why = [["no-python-object", 40 * 64 * MIB, 40, None]]
    found = judgement.judge(evidence(unheld=[unheld(why=why, graph_grads=40)], live_bytes=40 * 64 * MIB))
    assert kinds(found) == [("leak", "unheld")]
    assert "create_graph" in found[0].remedy and "the .grad of 40 tensors carries an autograd graph" in found[0].remedy
    assert found[0].suspects[0]["holders"] == []


def test_unheld_allocations_without_autograd_evidence_do_not_get_the_create_graph_story():
    why = [["no-python-object", 40 * 64 * MIB, 40, None]]
    found = judgement.judge(evidence(unheld=[unheld(why=why, graph_grads=0)], live_bytes=40 * 64 * MIB))
    assert kinds(found) == [("leak", "unheld")]
    assert "create_graph" not in found[0].remedy
    assert "cannot tell which" in found[0].remedy
    unreachable = [["unreachable", 40 * 64 * MIB, 40, "list"]]
    found = judgement.judge(evidence(unheld=[unheld(why=unreachable, graph_grads=0)], live_bytes=40 * 64 * MIB))
    assert "held by a list that nothing the program reaches refers to" in found[0].suspects[0]["summary"]
    assert "reference cycle that gc.collect() frees" in found[0].remedy


def test_an_out_of_memory_filled_by_an_accumulation_is_a_leak_and_an_out_of_memory_finding():
    acc = held(count=78, size=1024 * MIB, pattern="__main__.outputs[*]", kind="global")
    found = judgement.judge(evidence(ooms=[oom()], oom_accumulations=[acc], exited_normally=True,
                                     uncaught={"exc_type": "torch.OutOfMemoryError", "message": "",
                                               "stack": []}))
    assert kinds(found)[:2] == [("leak", "out-of-memory"), ("out-of-memory", "out-of-memory")]
    assert found[1].evidence["cause"] == "accumulation"
    assert "ended with this error" in found[1].summary
    assert "train.py:12 in step()" in found[0].summary


def test_out_of_memory_causes():
    too_big = oom(request_bytes=120 * 1024 * MIB)
    assert judgement.judge(evidence(ooms=[too_big]))[0].evidence["cause"] == "request-too-large"
    fragmented = oom(request_bytes=1536 * MIB, allocated_bytes=40 * 1024 * MIB,
                     largest_free_block_bytes=1024 * MIB, free_in_segments_bytes=38 * 1024 * MIB)
    assert judgement.judge(evidence(ooms=[fragmented]))[0].evidence["cause"] == "fragmentation"
    crowded = oom(allocated_bytes=10 * 1024 * MIB, processes=[[10, 11 * 1024 * MIB], [77, 60 * 1024 * MIB]])
    found = judgement.judge(evidence(ooms=[crowded]))[0]
    assert found.evidence["cause"] == "other-processes" and "1 other process held" in found.evidence["figures"]
    assert judgement.judge(evidence(ooms=[oom()]))[0].evidence["cause"] == "full"


def test_caught_or_not_is_said_only_when_known():
    caught = judgement.judge(evidence(ooms=[oom()], exited_normally=True))[0]
    assert "caught the error and went on" in caught.summary
    killed = judgement.judge(evidence(ooms=[oom()], exited_normally=False))[0]
    assert "caught" not in killed.summary and "ended with" not in killed.summary


def test_garbage_collected_during_the_run_is_garbage_cycle_evidence():
    collections = {"measured": 30, "skipped": 0, "freeing": 9, "freed_bytes": 9 * 640 * MIB,
                   "max_freed_bytes": 640 * MIB, "cost_s": 0.001}
    found = judgement.judge(evidence(collections=collections, garbage_bytes=0))
    assert kinds(found) == [("garbage-cycle", "gc-during-run")]
    assert found[0].bytes == 640 * MIB and "Nothing of it was left at exit" in found[0].summary


def test_fragmentation_is_the_cause_even_when_what_fills_the_memory_is_alike():
    """The free pieces would have served the request: fragmentation, though the memory in use
    is many alike tensors (kept on purpose, or not: the error itself is fragmentation's)."""
    kept = held(count=78, size=640 * MIB, pattern="__main__.results[*]", kind="global")
    fragmented = oom(request_bytes=1536 * MIB, allocated_bytes=78 * 640 * MIB,
                     largest_free_block_bytes=384 * MIB, free_in_segments_bytes=29 * 1024 * MIB)
    found = judgement.judge(evidence(ooms=[fragmented], oom_accumulations=[kept], accumulations=[kept]))
    assert kinds(found) == [("out-of-memory", "out-of-memory")]
    assert found[0].evidence["cause"] == "fragmentation"
    assert "expandable_segments:True" in found[0].remedy


def test_samples_that_missed_the_build_up_leave_the_structure_to_decide():
    found = judgement.judge(evidence(samples=11, enough_samples=False, unseen_bytes=316 * MIB,
                                     accumulations=[held(count=80, size=4 * MIB, pattern="__main__.seen[*]",
                                                         kind="global")], live_bytes=361 * MIB))
    assert kinds(found) == [("leak", "structure")]
    assert "did not see the memory build up (316 MiB" in found[0].summary


def test_samples_that_saw_it_only_at_the_very_end_leave_the_structure_to_decide():
    found = judgement.judge(evidence(samples=11, enough_samples=False, unseen_bytes=44 * MIB, watched_after=1,
                                     accumulations=[held(count=80, size=4 * MIB, pattern="__main__.seen[*]",
                                                         kind="global")], live_bytes=361 * MIB))
    assert kinds(found) == [("leak", "structure")]
    assert "only at the very end (the last 1 of 11 samples)" in found[0].summary
    assert found[0].evidence["watched_after"] == 1


def _finding(kind, bytes=1, **evidence):
    return Finding(kind=kind, bytes=bytes, summary="", evidence=evidence, remedy="", pid=1, device=0)


def test_the_verdict_of_an_out_of_memory_error():
    assert choose_verdict([_finding("out-of-memory", cause="full"), _finding("allocator-cache", bytes=10 << 30)]) \
        == "out-of-memory"
    assert choose_verdict([_finding("out-of-memory", cause="accumulation"), _finding("leak")]) == "leak"
    # a leak seen growing does not turn a fragmentation error into a leak verdict
    assert choose_verdict([_finding("out-of-memory", cause="fragmentation"), _finding("leak", bytes=50 << 30)]) \
        == "out-of-memory"


def test_the_cache_is_the_verdict_only_when_nothing_else_is():
    assert choose_verdict([_finding("garbage-cycle", bytes=272 << 20), _finding("allocator-cache", bytes=386 << 20)]) \
        == "garbage-cycle"
    assert choose_verdict([_finding("allocator-cache", bytes=386 << 20)]) == "allocator-cache"
    assert choose_verdict([_finding("child-contexts", bytes=3 << 30), _finding("leak", bytes=1 << 30)]) \
        == "child-contexts"
