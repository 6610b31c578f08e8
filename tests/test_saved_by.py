"""What saved a step's activations (gpumemdoctor/_agent/peak/saved_by.py): the pure attribution of a
step's events to the modules running when each block was made, the names, and the hooks themselves
on a CPU model (the events need CUDA: tests/gpu/test_allocated_peak.py reads them on a GPU)."""
from __future__ import annotations

import gc
import sys
from array import array
from types import SimpleNamespace

import pytest

from gpumemdoctor._agent.peak import replay as R
from gpumemdoctor._agent.peak import saved_by as S


def _e(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "time_us": t}


def _modules(events):
    times = array("q", [t for t, _, _ in events])
    ids = array("q", [i for _, i, _ in events])
    kinds = array("b", [k for _, _, k in events])
    return times, ids, kinds, len(events)


def test_each_activation_goes_to_the_innermost_module_running_when_it_was_made():
    # Module 1 (t 10-40) runs module 2 (t 12-20) then module 3 (t 22-30); backward t 50-70.
    mods = _modules([(10, 1, 1), (12, 2, 1), (20, 2, -1), (22, 3, 1), (30, 3, -1), (40, 1, -1)])
    trace = [
        _e("alloc", 0xA, 100, 5),            # before the recorded step: not counted
        _e("alloc", 0xB, 1000, 13),          # in 2, freed in backward: an activation of 2
        _e("alloc", 0xC, 50, 14),            # in 2, freed before backward: a temporary
        _e("free_requested", 0xC, 50, 15),
        _e("alloc", 0xD, 3000, 25),          # in 3, freed in backward
        _e("alloc", 0xE, 7, 35),             # in 1 itself, freed in backward
        _e("alloc", 0xF, 200, 45),           # no module running (the loss), freed in backward
        _e("free_requested", 0xB, 1000, 55),
        _e("free_requested", 0xD, 3000, 56),
        _e("free_requested", 0xE, 7, 57),
        _e("free_requested", 0xF, 200, 58),
        _e("free_requested", 0xA, 100, 60),  # made before the step: left out
        _e("alloc", 0x10, 9, 61),            # made in backward: not an activation
        _e("free_requested", 0x10, 9, 62),
    ]
    found = S.attribute(trace, 10, [50, 70], [R.BACKWARD, R.BACKWARD_END], *mods)
    assert found == {"modules": {2: [1000, 1], 3: [3000, 1], 1: [7, 1]}, "outside": 200, "total": 4207}


def test_no_whole_backward_after_the_start_gives_nothing():
    mods = _modules([(10, 1, 1), (40, 1, -1)])
    trace = [_e("alloc", 0xB, 1000, 13), _e("free_requested", 0xB, 1000, 55)]
    assert S.attribute(trace, 10, [50], [R.BACKWARD], *mods) is None  # (its end not marked)
    assert S.attribute(trace, 60, [50, 70], [R.BACKWARD, R.BACKWARD_END], *mods) is None  # before the start


def test_names_are_folded_and_grouped_by_a_repeated_blocks_child():
    assert S.fold("transformer.h.3.attn.c_attn") == "transformer.h[*].attn.c_attn"
    assert S.fold("layers.0.1.conv") == "layers[*][*].conv"
    assert S.fold("lm_head") == "lm_head"
    assert S.group("transformer.h[*].attn.c_attn") == "transformer.h[*].attn"
    assert S.group("transformer.h[*].ln_1") == "transformer.h[*].ln_1"
    assert S.group("transformer.wte") == "transformer.wte"
    assert S.group("encoder.block.inner.proj") == "encoder.block"
    assert S.group("GPT2LMHeadModel") == "GPT2LMHeadModel"


torch = pytest.importorskip("torch")


def _watch():
    watch = S.ForwardWatch(SimpleNamespace(torch=torch, steps=3), SimpleNamespace(bulk=None), None)
    watch.torch_dir = __import__("os").path.dirname(torch.__file__) + __import__("os").sep
    return watch


def test_the_hooks_write_each_forward_and_the_programs_line_and_leave_the_count_alone():
    """The hooks on a real model (CPU): every module's beginning and end, the roots, the line that
    called the outermost forward; and no object the collector counts made by a hook."""
    from torch.nn.modules import module

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    watch = _watch()
    handles = [module.register_module_forward_pre_hook(watch._pre),
               module.register_module_forward_hook(watch._post, always_call=True)]
    try:
        x = torch.randn(3, 4)
        model(x); line = sys._getframe().f_lineno  # noqa: E702 (the call's line)
    finally:
        for h in handles:
            h.remove()
    assert watch.n == 8 and list(watch.kinds[:8]) == [1, 1, -1, 1, -1, 1, -1, -1]
    assert watch.ids[0] == id(model) and watch.ids[1] == id(model[0]) and watch.ids[7] == id(model)
    assert watch.roots[0] is model and watch.roots[1] is None
    assert watch.where[0] == __file__ and watch.where[1] == line
    assert watch.depth == 0
    # The hooks themselves make nothing the collector counts (called directly, as _call_impl does).
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(100):
            watch._pre(model, ())
            watch._post(model, (), None)
        after = gc.get_count()[0]
    finally:
        gc.enable()
    assert after == before


def test_a_forward_that_raises_still_ends_its_modules():
    from torch.nn.modules import module

    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    watch = _watch()
    handles = [module.register_module_forward_pre_hook(watch._pre),
               module.register_module_forward_hook(watch._post, always_call=True)]
    try:
        with pytest.raises(ValueError):
            model(torch.randn(2, 4))
    finally:
        for h in handles:
            h.remove()
    assert watch.depth == 0 and list(watch.kinds[:watch.n]).count(1) == list(watch.kinds[:watch.n]).count(-1)


def test_names_come_from_the_roots_named_modules():
    model = torch.nn.Module()
    model.h = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(2, 2)) for _ in range(2)])
    wanted = {id(model): 1, id(model.h[1][0]): 1}
    names: dict = {}
    S._name(model, wanted, names)
    assert names == {id(model): "Module", id(model.h[1][0]): "h[*][*]"}


def test_nothing_is_recorded_where_torch_compile_compiled_a_frame(monkeypatch):
    fake = SimpleNamespace(counters={"stats": {"unique_graphs": 1}})
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", fake)
    assert S._compiled()
    fake.counters = {"stats": {"unique_graphs": 0}, "frames": {"ok": 0}}
    assert not S._compiled()


def test_the_report_names_the_modules_as_the_activations_holders_with_the_line():
    from gpumemdoctor.diagnosis.allocated_peak import saved_by

    record = {"t": 1.0, "step": 4, "device": 0, "activations": 10 << 30, "outside_modules": 1 << 20, "rest": 0,
              "forwards": 330, "full": False, "line": {"file": "/x/train.py", "line": 26, "function": "<module>"},
              "modules": [{"name": "transformer.h[*].mlp", "bytes": 6 << 30, "blocks": 60},
                          {"name": "transformer.h[*].attn", "bytes": 4 << 30, "blocks": 90}]}
    agent = SimpleNamespace(root={"forward_modules": [{**record, "device": 1}, record]})
    holders, note = saved_by(agent, 0)
    assert holders == [{"name": "transformer.h[*].mlp", "bytes": 6 << 30, "line": "train.py:26"},
                       {"name": "transformer.h[*].attn", "bytes": 4 << 30, "line": "train.py:26"}]
    assert "step 5" in note and "train.py:26" in note and "; 1.00 MiB made with no module running" in note
    assert saved_by(SimpleNamespace(root={"forward_modules": [{**record, "error": "x"}]}), 0) is None


def test_the_recorded_step_keeps_no_model_alive_after_it():
    """The roots are held while the step is recorded (to name its modules), never after: a program
    that drops its model after training gets its memory back."""
    import weakref

    model = torch.nn.Linear(4, 4)
    watch = _watch()  # (no Bulk: the reading is skipped, the roots let go all the same)
    watch.state = S.RECORDING
    watch._pre(model, ())
    watch._post(model, (), None)
    assert watch.roots[0] is model
    gone = weakref.ref(model)
    watch.at_step()
    del model
    gc.collect()
    assert gone() is None and watch.roots == [None] * S.MAX_ROOTS and watch.state == S.DONE


def _busy_watch(events_then, events_now, ring_events):
    """A watch recording device 0's step, whose allocator's ring holds `ring_events` events."""
    sampler = SimpleNamespace(rows=[[0, 0, 0, 0, 0, 0, 0, 0]], events=[events_then])
    history = SimpleNamespace(bulk=None, ring=SimpleNamespace(holds=lambda n: n <= ring_events))
    watch = S.ForwardWatch(SimpleNamespace(torch=torch, steps=3), history, sampler)
    watch.events0 = watch._events()
    sampler.events[0] = events_now
    watch.state = S.RECORDING
    removed = []
    watch.handles = [SimpleNamespace(remove=lambda: removed.append(1)), None]
    return watch, removed


def test_a_busy_step_end_reads_the_recorded_step_at_the_next_one_where_the_ring_still_holds_it():
    """A step's end whose sample already paused the program (a new high's probe: 3.6 ms on GPT-2)
    reads the recorded step at the next step's end, the hooks off at once: GPT-2's step ends paused
    11.0-11.3 ms where both fell together. Only where the ring holds another step like it."""
    watch, removed = _busy_watch(1000, 3400, 10_000)  # 2,400 events a step: 6,000 fit in 10,000
    watch.at_step(0.004)
    assert watch.state == S.READ_NEXT and removed == [1] and watch.handles == [None, None]
    watch.at_step(0.004)  # the next step's end reads it, busy or not
    assert watch.state == S.DONE and removed == [1]
    watch, removed = _busy_watch(1000, 3400, 5_000)  # 6,000 would not fit: read now
    watch.at_step(0.004)
    assert watch.state == S.DONE and removed == [1]
    watch, removed = _busy_watch(1000, 3400, 10_000)
    watch.at_step(0.002)  # not busy: read now
    assert watch.state == S.DONE
    watch, removed = _busy_watch(None, None, 10_000)  # no count of the events: read now
    watch.at_step(0.004)
    assert watch.state == S.DONE


def test_a_ring_that_no_longer_holds_the_recorded_steps_start_gives_an_error_not_a_short_count():
    import json

    trace = [_e("alloc", 0xB, 1000, 120), _e("free_requested", 0xB, 1000, 130)]
    history = SimpleNamespace(snapshot=lambda torch: {"device_traces": [trace]},
                              marks=SimpleNamespace(ordered=lambda times, kinds, since: None))
    watch = S.ForwardWatch(SimpleNamespace(torch=torch, steps=3), history, None)
    watch.since_us = 100  # the recording began before the ring's first event
    record = json.loads(watch._read(0))
    assert record["error"] == "the allocator's ring no longer held the recorded step's start"
    watch.since_us = 150  # (the ring reaches back past it: read as usual; here no backward() was marked)
    assert json.loads(watch._read(0))["error"] == "no backward() in the recorded step"
    # each record says the step whose end read it, and the report's parser keeps it (older ones lack it)
    from gpumemdoctor.recording.records import FORWARD_MODULES

    assert (record["step"], record["read_step"]) == (0, 3)
    assert FORWARD_MODULES(record, "forward_modules")["read_step"] == 3
    del record["read_step"]
    assert "read_step" not in FORWARD_MODULES(record, "forward_modules")
