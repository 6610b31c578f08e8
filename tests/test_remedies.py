"""The remedies table (gpumemdoctor/diagnosis/remedies.py): every row reads as two sentences in the
user's words, the row is chosen by holder kind and what the memory did, and a holder path that shows
a model copied each time gets its own."""
from __future__ import annotations

import pytest

from gpumemdoctor.diagnosis import remedies

KINDS = sorted({kind for kind, _ in remedies.REMEDIES if kind != "*"})
WHERE = ["/home/u/train.py", 41, "main"]


def holder(kind, pattern="__main__.kept[*]", path=None):
    return {"kind": kind, "pattern": pattern, "path": path or pattern.replace("*", "3")}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("situation", ["leak", "released", "phase", "live"])
def test_every_row_fills_its_fields_and_names_the_line(kind, situation):
    text = remedies.remedy(holder(kind), WHERE, situation)
    assert "{" not in text and "}" not in text
    assert "(allocated at /home/u/train.py:41)" in text
    assert text.count(". ") >= 1 and text.endswith(".")


def test_an_evaluation_s_running_sum_gets_no_grad_and_item():
    h = holder("autograd-graph", "thread 'MainThread': evaluate() at e.py local total",
               "thread 'MainThread': evaluate() at e.py:9 local total.grad_fn (5 autograd nodes down)._saved_mat1")
    text = remedies.remedy(h, None, "phase")
    assert text.startswith("thread 'MainThread': evaluate() at e.py:9 local total keeps every batch's autograd graph")
    assert "model.eval() does not stop autograd" in text and "torch.no_grad()" in text and "loss.item()" in text
    assert "torch.no_grad()" not in remedies.remedy(h, None, "leak")  # over the run: accumulate .item()


def test_what_a_pause_gathers_is_about_the_peak_and_what_grows_about_the_container():
    h = holder("attribute", "__main__.model.validation_step_outputs[*]")
    assert "until the evaluation ends" in remedies.remedy(h, None, "phase")
    assert remedies.remedy(h, None, "leak").startswith("The attribute validation_step_outputs of __main__.model")


def test_a_model_copied_every_step_is_told_to_update_the_average_in_place():
    h = holder("global", "__main__.ema_history[*]._modules[*]._parameters['weight']")
    text = remedies.remedy(h, WHERE, "leak")
    assert "a deep copy per step keeps every copy" in text and "in place" in text
    # A model's own parameters, still held at exit, are not copies.
    own = holder("attribute", "__main__.model._modules[*]._parameters['weight']")
    assert "deep copy" not in remedies.remedy(own, None, "live")
    assert "still references it" in remedies.remedy(own, None, "live")


def test_blocks_without_a_holder_get_the_remedy_of_their_reason():
    assert "--trace on" in remedies.unheld_remedy([["not-reached", 3, 0, None]], WHERE, graph_grads=4)
    assert "create_graph" in remedies.unheld_remedy([["no-python-object", 3, 0, None]], None, graph_grads=4)
    assert "cuBLAS workspace" in remedies.unheld_remedy(None, None, live=True)
    assert "reference cycle" in remedies.unheld_remedy([["unreachable", 3, 0, "dict"]], None, live=True)


def test_every_out_of_memory_cause_has_its_remedy_in_the_table():
    """The judgement's row 5 names a cause; its remedy is this table's, one sentence or two."""
    from gpumemdoctor.diagnosis.out_of_memory import OOM_CAUSES

    assert set(remedies.OUT_OF_MEMORY) == set(OOM_CAUSES)
    assert all(text.endswith(".") and "{" not in text for text in remedies.OUT_OF_MEMORY.values())
