"""Who holds a library loop's gathered result (gpumemdoctor/_agent/search/loop_holder.py): the name in the
loop's frame, or a frame it called, that holds the tensor at the concatenation's address, read one
level down, with the frame's line. CPU tensors stand in for the GPU's (the storage's address is what
is compared)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from gpumemdoctor._agent.peak.reading import loop_of
from gpumemdoctor._agent.search.loop_holder import holder

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (a CPU build will do)")

LIBRARY = '''\
class EvalLoopContainer:
    def __init__(self):
        self.tensors = None

    def add(self, t):
        self.tensors = t if self.tensors is None else CAT((self.tensors, t))


def evaluation_loop(batches, callback):
    all_preds = EvalLoopContainer()
    for batch in batches:
        all_preds.add(batch)
        found = callback()
    return found
'''


def _loop(tmp_path, torch, callback):
    library = tmp_path / "site-packages" / "transformers" / "trainer.py"
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_text(LIBRARY)
    namespace: dict = {"CAT": torch.cat, "__name__": "transformers.trainer"}
    exec(compile(LIBRARY, str(library), "exec"), namespace)
    return namespace["evaluation_loop"]


def test_the_loops_gathered_result_is_named_with_the_librarys_line(tmp_path):
    torch = pytest.importorskip("torch")
    seen = {}

    def on_prediction_step():  # the program's callback, called by the loop
        frame = sys._getframe()
        loop, _, loop_frame = loop_of(frame)
        assert loop == "transformers.Trainer.evaluation_loop"
        result = loop_frame.f_locals["all_preds"].tensors
        address = result.untyped_storage().data_ptr()
        seen["found"] = holder(torch.Tensor, torch.nn.Parameter, frame, loop_frame, address)
        seen["missing"] = holder(torch.Tensor, torch.nn.Parameter, frame, loop_frame, address + 1)
        del result, loop_frame, frame
        return seen["found"]

    evaluation_loop = _loop(tmp_path, torch, on_prediction_step)
    line = LIBRARY.splitlines().index("        found = callback()") + 1
    assert evaluation_loop([torch.ones(4), torch.ones(4)], on_prediction_step) == \
        f"evaluation_loop() local all_preds.tensors at trainer.py:{line}"
    assert seen["missing"] is None


def test_a_list_of_results_and_a_tensor_subclass(tmp_path):
    torch = pytest.importorskip("torch")
    asked = []

    class Traced(torch.Tensor):  # a subclass with a __torch_function__ of its own is not asked
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            asked.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    kept = torch.ones(8)
    other = torch.ones(8).as_subclass(Traced)

    def loop_body():
        frame = sys._getframe()
        _, _, loop_frame = loop_of(frame)
        found = holder(torch.Tensor, torch.nn.Parameter, frame, loop_frame, kept.untyped_storage().data_ptr())
        del frame, loop_frame
        return found

    library = tmp_path / "site-packages" / "transformers" / "trainer.py"
    library.parent.mkdir(parents=True)
    source = "def evaluation_loop(body, batches):\n    preds = list(batches)\n    return body()\n"
    library.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(library), "exec"), namespace)
    asked.clear()
    assert namespace["evaluation_loop"](loop_body, iter([other, kept])) == \
        "evaluation_loop() local preds[*] at trainer.py:3"
    assert asked == []


def test_outside_a_loop_or_under_a_tracer_nothing_is_searched(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.ones(2)
    frame = sys._getframe()
    assert holder(torch.Tensor, torch.nn.Parameter, frame, object(), t.untyped_storage().data_ptr()) is None
    previous = sys.gettrace()
    sys.settrace(lambda *a: None)
    try:
        assert holder(torch.Tensor, torch.nn.Parameter, frame, frame, t.untyped_storage().data_ptr()) is None
    finally:
        sys.settrace(previous)
