"""Out of memory: what would have made it fit (diagnosis/fit.py, issue 40). The figures here are
made up for the rule; the recording that shows it on a GPU is
tests/fixtures/reports/oom_gradients_outside_steps.json."""
from __future__ import annotations

import pytest

from gpumemdoctor.diagnosis import fit

GIB = 1 << 30


def oom(request: int, free: int, *, inside=None, optimizers=(), split=0, processes=(), limit=80 * GIB,
        grad_enabled=False, paused=False) -> dict:
    return {"request_bytes": request, "device_free_bytes": free, "limit_bytes": limit, "inside": inside,
            "grad_enabled": grad_enabled, "paused": paused,
            "optimizers": [list(o) for o in optimizers], "free_in_segments_bytes": split,
            "processes": [list(p) for p in processes]}


ADAMW = ("AdamW", 11 * GIB, 11 * GIB, 22 * GIB)


def test_gradients_held_while_no_step_runs_would_have_made_it_fit():
    found = fit.what_fits(oom(8 * GIB, 1 * GIB, optimizers=[ADAMW]), [], pid=1)
    assert (found["part"], found["bytes"], found["fits"]) == ("gradients", 11 * GIB, True)
    assert found["free_then_bytes"] == 12 * GIB
    assert "zero_grad(set_to_none=True)" in found["remedy"]
    assert "Freeing the gradients that the optimizers' parameters still held, no step running (11.0 GiB) " \
           "would have left about 12.0 GiB free, enough for the 8.00 GiB asked for" in fit.words(found)


@pytest.mark.parametrize("where", [{"inside": "backward"}, {"inside": "optimizer step"},
                                   {"grad_enabled": True}, {"grad_enabled": None, "paused": None}])
def test_in_a_step_or_where_it_cannot_be_told_the_gradients_and_state_are_not_offered(where):
    """Inside backward() (the main thread's place: CUDA's backward runs on PyTorch's own threads), in
    an optimizer's step, in a step's forward with grad mode on (micro-batches may be accumulating
    gradients), or in an older recording that did not say."""
    found = fit.what_fits(oom(8 * GIB, 1 * GIB, optimizers=[ADAMW], **where), [], pid=1)
    assert found is None


def test_an_evaluation_with_grad_mode_on_between_paused_steps_offers_the_gradients():
    found = fit.what_fits(oom(8 * GIB, 1 * GIB, optimizers=[ADAMW], grad_enabled=True, paused=True), [], pid=1)
    assert found["part"] == "gradients"


def test_the_cheapest_part_that_fits_comes_before_a_larger_one():
    kept = [{"kind": "global", "pattern": "__main__.outputs[*]", "bytes": 30 * GIB}]
    found = fit.what_fits(oom(4 * GIB, 1 * GIB, optimizers=[ADAMW], split=5 * GIB), kept, pid=1)
    assert found["part"] == "gradients"
    assert [p for p, _ in found["parts"]] == ["gradients", "fragmentation", "kept", "optimizer-state"]


def test_where_no_part_fits_alone_the_largest_is_named_with_the_shortfall():
    found = fit.what_fits(oom(40 * GIB, 1 * GIB, optimizers=[ADAMW]), [], pid=1)
    assert (found["part"], found["fits"]) == ("optimizer-state", False)
    assert "alone it would have left about 23.0 GiB free, 17.0 GiB short of the 40.0 GiB asked for" \
        in fit.words(found)


def test_graphs_and_other_processes():
    graphs = [{"kind": "autograd-graph", "pattern": "__main__.outputs[*].grad_fn (autograd graph)", "bytes": 9 * GIB}]
    found = fit.what_fits(oom(2 * GIB, 0, processes=[[1, 60 * GIB], [2, 5 * GIB]]), graphs, pid=1)
    assert found["part"] == "graphs" and "torch.no_grad()" in found["remedy"]
    found = fit.what_fits(oom(2 * GIB, 0, processes=[[1, 60 * GIB], [2, 5 * GIB]]), [], pid=1)
    assert (found["part"], found["bytes"]) == ("other-processes", 5 * GIB)


@pytest.mark.parametrize("request_bytes", [81 * GIB])
def test_a_request_larger_than_the_process_may_use_has_no_fit(request_bytes):
    assert fit.what_fits(oom(request_bytes, 1 * GIB, optimizers=[ADAMW]), [], pid=1) is None


def test_older_recordings_without_the_optimizers_offer_what_they_have():
    record = oom(2 * GIB, 1 * GIB, split=3 * GIB)
    del record["optimizers"], record["inside"]
    assert fit.what_fits(record, [], pid=1)["part"] == "fragmentation"
