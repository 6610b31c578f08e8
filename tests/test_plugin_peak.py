"""What filled a pytest vram_limit test's peak, from PyTorch's allocation events, without a GPU
(gpumemdoctor/_agent/peak/plugin_history.py, gpumemdoctor/reporters/plugin_peak.py).

The words from a split; the walk back started after the peak, where the test's lasting tensors were
still alive, on small traces whose answer is known and on the recorded GPT-2 history
(tests/fixtures/history/) with the test's teardown added; the storages read from optimizers; the
recording turned on and off around a test, against a test double of torch here and in the plugin,
and with a CPU build of torch. tests/gpu/test_pytest_plugin_gpu.py runs it on a GPU.
"""
from __future__ import annotations

import re
import types

from gpumemdoctor._agent.peak import replay as R
from gpumemdoctor._agent.peak.plugin_history import CAPACITY, PeakHistory, peak_split, storages_of
from gpumemdoctor.reporters.plugin_peak import what_filled

from .test_pytest_plugin import FAKE_OPTIM, _need_torch
from .test_replay import gpt2_recording

pytest_plugins = ["pytester"]

MIB = 1 << 20
GIB = 1 << 30
B, B_END, STEP, STEP_END = R.BACKWARD, R.BACKWARD_END, R.STEP, R.STEP_END
FALLBACK = ("What filled it, read at the last optimizer step (the only one), not at the peak itself: parameters "
            "64.0 MiB, gradients 0 B, optimizer state 128 MiB; the rest of the peak, 100 MiB, unclassified "
            "(activations, temporaries).")


def _e(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "time_us": t}


def _parts(found: dict) -> dict:
    return {k: v["bytes"] for k, v in found["parts"].items()}


def _found(parts: dict, phase="backward", complete=True, ring_full=False, events=5000) -> dict:
    return {"parts": {k: {"bytes": v} for k, v in parts.items()}, "phase": phase, "complete": complete,
            "ring_full": ring_full, "events": events}


# -- the words ------------------------------------------------------------------------------------

def test_the_split_is_said_largest_part_first():
    found = _found({"parameters": 500 * MIB, "activations": 2 * GIB, "temporaries": 120 * MIB,
                    "optimizer-state": GIB, "gradients": 0, "kept-tensors": 4096, "unclassified": 512})
    assert what_filled(found, FALLBACK) == (
        "What filled it, at the peak itself, which came inside backward(): activations 2.00 GiB, optimizer state "
        "1.00 GiB, parameters 500 MiB, temporaries 120 MiB, and 2 more (4.50 KiB).")
    tie = _found({"temporaries": 256 * MIB, "kept-tensors": 256 * MIB, "activations": 256 * MIB})
    assert what_filled(tie, "").endswith(": activations 256 MiB, temporaries 256 MiB, kept tensors 256 MiB.")
    outside = what_filled(_found({"gathered": 300 * MIB, "temporaries": 50 * MIB}, phase="outside"), "")
    assert outside == ("What filled it, at the peak itself, which came outside backward() and the optimizer steps "
                       "(a forward, an evaluation, the program's own code): gathered, then freed 300 MiB, "
                       "temporaries 50.0 MiB.")
    full = what_filled(_found({"activations": GIB}, ring_full=True, events=100_000), FALLBACK)
    assert full.endswith("PyTorch's allocation events kept only the last 100,000: what was made before them is "
                         "told by the optimizers' storages only, the rest kept tensors or unclassified.")


def test_without_the_peak_in_the_events_it_says_so_and_what_it_said_before():
    assert what_filled(None, FALLBACK) == FALLBACK  # no events kept: the words as they were
    assert what_filled(None, "") == ""
    assert what_filled(_found({}, complete=False), FALLBACK) == (
        "PyTorch's allocation events did not reach back to the peak. " + FALLBACK)
    assert what_filled(_found({}, complete=False, ring_full=True, events=100_000), FALLBACK) == (
        "PyTorch's allocation events did not reach back to the peak: they kept only the last 100,000. " + FALLBACK)
    assert what_filled({"error": "RuntimeError: no history"}, "") == (
        "PyTorch's allocation events did not split it (RuntimeError: no history).")


# -- the walk back, from after the peak -----------------------------------------------------------

# A test's training: a parameter P (64), two forwards' activations X1, X2 (100 each), backward's
# gradients G1, G2 (64), the optimizer's state S (128, at the first step); its teardown frees them
# all. The peak (356) comes in the second backward, as G2 is made. Storages read at each step's end.
TRAINING = [_e("alloc", 1, 64, 10), _e("alloc", 2, 100, 20), _e("alloc", 3, 64, 35), _e("free_requested", 2, 100, 40),
            _e("alloc", 4, 128, 65),
            _e("free_requested", 3, 64, 80), _e("alloc", 5, 100, 90), _e("alloc", 6, 64, 105),
            _e("free_requested", 5, 100, 110),
            _e("free_requested", 6, 64, 150), _e("free_requested", 4, 128, 151), _e("free_requested", 1, 64, 152)]
TRAINING_MARKS = ([30, 50, 60, 70, 100, 120, 130, 140], [B, B_END, STEP, STEP_END, B, B_END, STEP, STEP_END])
FIRST_STEP = (70, {1: 1, 3: 2, 4: 3}, {1: 64, 3: 64, 4: 128})
SECOND_STEP = (140, {1: 1, 6: 2, 4: 3}, {1: 64, 6: 64, 4: 128})


def test_a_tests_lasting_tensors_are_told_where_they_were_alive_after_the_peak():
    times, kinds = TRAINING_MARKS
    found = peak_split(TRAINING, 0, 356, times, kinds, [FIRST_STEP, SECOND_STEP])
    assert found["complete"] and found["allocated_peak"] == 356 and found["phase"] == "backward"
    assert _parts(found) == {"parameters": 64, "optimizer-state": 128, "activations": 100, "gradients": 64}
    # From the end, after the teardown, the parameter would be an activation and the state a temporary.
    assert _parts(R.replay(TRAINING, 0, times, kinds, {}, {}, None, 356)) == {
        "activations": 164, "temporaries": 128, "gradients": 64}


def test_without_a_step_after_the_peak_the_walk_starts_where_a_backward_ends():
    times, kinds = TRAINING_MARKS
    # Only the first step's storages (read before the peak; G1's address freed since is left out).
    found = peak_split(TRAINING, 0, 356, times, kinds, [FIRST_STEP])
    assert _parts(found) == {"parameters": 64, "optimizer-state": 128, "activations": 100, "gradients": 64}
    # No optimizer: the parameter and state are kept tensors, G2 a gradient (made in backward, alive at its end).
    found = peak_split(TRAINING, 0, 356, times, kinds, [])
    assert _parts(found) == {"kept-tensors": 192, "activations": 100, "gradients": 64}


def test_an_evaluation_after_the_last_step_keeps_the_optimizers_storages():
    # One step (storages read at 70), then an evaluation's 300 at G1's freed address; teardown at 150.
    trace = TRAINING[:5] + [_e("free_requested", 3, 64, 80), _e("alloc", 3, 300, 90), _e("free_requested", 3, 300, 100),
                            _e("free_requested", 4, 128, 150), _e("free_requested", 1, 64, 151)]
    found = peak_split(trace, 0, 492, [30, 50, 60, 70], [B, B_END, STEP, STEP_END], [FIRST_STEP])
    assert found["phase"] == "outside"
    assert _parts(found) == {"parameters": 64, "optimizer-state": 128, "gathered": 300}


def test_no_backward_and_no_step_still_splits():
    # 100 allocated before the test (a module's fixture, alive after it); A held to the end, C freed soon.
    trace = [_e("alloc", 1, 40 * MIB, 10), _e("alloc", 2, 30 * MIB, 20), _e("free_requested", 2, 30 * MIB, 30),
             _e("alloc", 3, 50 * MIB, 40), _e("free_requested", 3, 50 * MIB, 50), _e("free_requested", 1, 40 * MIB, 100)]
    found = peak_split(trace, 100 * MIB, 190 * MIB, [], [], [])
    assert _parts(found) == {"kept-tensors": 100 * MIB, "gathered": 40 * MIB, "temporaries": 50 * MIB}
    assert what_filled(found, "").startswith("What filled it, at the peak itself, which came outside backward() and "
                                             "the optimizer steps (a forward, an evaluation, the program's own code): "
                                             "kept tensors 100 MiB, temporaries 50.0 MiB, gathered, then freed 40.0 MiB.")
    assert peak_split([], 0, 0, [], [], []) is None
    assert not peak_split(trace, 100 * MIB, 250 * MIB, [], [], [])["complete"]  # the counter's peak before them


def _gpt2():
    """The recorded GPT-2 steps (tests/test_replay.py), and the storages as read after them."""
    return gpt2_recording()


def _size(text: str, label: str) -> float:
    number, unit = re.search(rf"{label} ([\d.]+) (GiB|MiB)", text).groups()
    return float(number) * (GIB if unit == "GiB" else MIB)


def test_gpt2s_peak_in_a_failure_message():
    d, trace, times, kinds, storages, sizes = _gpt2()
    counter = d["per_step"][-1]["peak"]
    read = (trace[-1]["time_us"] + 1, storages, sizes)
    text = what_filled(peak_split(trace, d["allocated"], counter, times, kinds, [read]), FALLBACK)
    assert text == ("What filled it, at the peak itself, which came inside backward(): activations 10.2 GiB, "
                    "temporaries 3.07 GiB, optimizer state 949 MiB, parameters 475 MiB, kept tensors 69.3 MiB.")
    assert abs(_size(text, "activations") - 10.171 * GIB) < 0.05 * GIB  # MemTracker: 10.17 GiB


def test_gpt2_after_its_teardown_is_split_as_before_it():
    """As a test would leave it: every block still allocated freed after the last step. Walked back from
    the first step's end after the peak (the storages read there), the split is the same."""
    d, trace, times, kinds, storages, sizes = _gpt2()
    counter = d["per_step"][-1]["peak"]
    live = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
    end = trace[-1]["time_us"]
    torn = trace + [_e("free_requested", a, s, end + 10 + i) for i, (a, s) in enumerate(live.items())]
    before = d["allocated"] - sum(live.values())  # made before the events began
    ends = [t for k, t in d["marks"] if k == "step_end"]
    found = peak_split(torn, before, counter, times, kinds, [(t, storages, sizes) for t in ends])
    kept = peak_split(trace, d["allocated"], counter, times, kinds, [(end + 1, storages, sizes)])
    # (the last loss, 4 bytes, freed after the last step: kept at that step's end, an activation from the end)
    assert found["parts"].keys() == kept["parts"].keys()
    assert all(abs(_parts(found)[k] - _parts(kept)[k]) <= 512 for k in _parts(kept)), (_parts(found), _parts(kept))
    assert what_filled(found, "") == what_filled(kept, "")
    assert _parts(R.replay(torn, before, times, kinds, {}, {}, None, counter)).get("parameters") is None


# -- the optimizers' storages ---------------------------------------------------------------------

class _Storage:
    def __init__(self, ptr, nbytes):
        self.ptr, self.size = ptr, nbytes

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.size


class _Tensor:
    def __init__(self, ptr, nbytes, device=0, grad=None):
        self.storage, self.device, self.grad = _Storage(ptr, nbytes), device, grad

    def get_device(self):
        return self.device

    def untyped_storage(self):
        return self.storage


def _optimizer(params, state):
    return types.SimpleNamespace(param_groups=[{"params": params}], state=state)


def test_the_storages_replay_wants_from_optimizers():
    w = _Tensor(100, 4096, grad=_Tensor(200, 4096))
    b = _Tensor(300, 512)  # no gradient yet
    on_cpu = _Tensor(400, 64, device=-1)
    adam = _optimizer([w, b, on_cpu], {w: {"exp_avg": _Tensor(500, 4096), "exp_avg_sq": _Tensor(600, 4096), "step": 3},
                                       b: {"view": _Tensor(300, 512)}})  # a state tensor that views b: b's storage
    sgd = _optimizer([w], {})  # w in two optimizers: once
    assert storages_of([adam, sgd]) == {
        0: ({100: 1, 300: 1, 200: 2, 500: 3, 600: 3}, {100: 4096, 300: 512, 200: 4096, 500: 4096, 600: 4096}),
        -1: ({400: 1}, {400: 64})}
    assert storages_of([]) == {}


STORAGES_CPU = """
import torch
from gpumemdoctor._agent.peak.plugin_history import storages_of

model = torch.nn.Linear(4, 4)  # 16 + 4 float32: 80 bytes
adam = torch.optim.Adam(model.parameters())
model(torch.ones(2, 4)).sum().backward()
adam.step()
storages, sizes = storages_of([adam])[-1]
assert sorted(storages.values()) == [1, 1, 2, 2, 3, 3, 3, 3, 3, 3], storages  # Adam's step counts are tensors
assert storages[model.weight.untyped_storage().data_ptr()] == 1 and sizes[model.weight.grad.untyped_storage().data_ptr()] == 64
assert sum(sizes.values()) == 80 + 80 + 2 * 80 + 2 * 4, sizes
print("ok")
"""


def test_the_storages_of_a_cpu_optimizer():
    import subprocess
    import sys

    _need_torch()
    out = subprocess.run([sys.executable, "-c", STORAGES_CPU], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# -- on and off around a test ---------------------------------------------------------------------

def _fake_torch(history_on=False, initialised=True):
    """A torch double with what PeakHistory touches; `calls` lists what it was asked."""
    calls = []
    state = types.SimpleNamespace(on=history_on, initialised=initialised)

    def record(enabled="all", context="all", stacks="all", max_entries=0):
        calls.append(("record", enabled, context, stacks, max_entries))
        state.on = enabled is not None

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None):
        calls.append("backward")

    hooks = {}

    def register(kind):
        def add(hook):
            key = object()
            hooks[key] = (kind, hook)
            return types.SimpleNamespace(remove=lambda: hooks.pop(key))
        return add

    queued = []
    torch = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: state.on),
        cuda=types.SimpleNamespace(is_initialized=lambda: state.initialised, _queued_calls=queued,
                                   _lazy_call=lambda fn: queued.append((fn, [])),
                                   memory=types.SimpleNamespace(_record_memory_history=record)),
        autograd=types.SimpleNamespace(backward=backward),
        optim=types.SimpleNamespace(optimizer=types.SimpleNamespace(
            register_optimizer_step_pre_hook=register("pre"), register_optimizer_step_post_hook=register("post"))))
    return torch, calls, state, hooks


def test_the_events_are_turned_on_for_the_test_and_off_after_it():
    torch, calls, state, hooks = _fake_torch()
    original = torch.autograd.backward
    events = PeakHistory.start(torch, torch.optim.optimizer)
    assert calls == [("record", "all", None, "python", CAPACITY)] and state.on and events.own
    assert torch.autograd.backward is not original and torch.autograd.backward.__wrapped__ is original
    assert [kind for kind, _ in hooks.values()] == ["pre"]  # (the end: the plugin's post hook calls on_step)
    torch.autograd.backward(None)  # marked, and passed on
    assert calls[-1] == "backward" and events.marks.n == 2
    [(_, pre)] = hooks.values()
    pre(None, (), {})
    events.on_step(_optimizer([], {}), (), {})
    assert list(events.marks.kinds[:4]) == [B, B_END, STEP, STEP_END]
    events.unmark()
    assert torch.autograd.backward is original and hooks == {}
    events.close()
    assert calls[-1] == ("record", None, "all", "all", 0) and not state.on


def test_a_history_already_on_is_left_as_it_was():
    torch, calls, state, hooks = _fake_torch(history_on=True)
    events = PeakHistory.start(torch, torch.optim.optimizer)
    events.close()
    assert calls == [] and state.on and events.theirs and not events.own


def test_where_cuda_starts_during_the_test_the_events_start_with_it():
    torch, calls, state, hooks = _fake_torch(initialised=False)
    events = PeakHistory.start(torch, torch.optim.optimizer)
    assert calls == [] and len(torch.cuda._queued_calls) == 1
    torch.cuda._queued_calls[0][0]()  # CUDA's start runs the queued calls
    assert calls == [("record", "all", None, "python", CAPACITY)]
    events.close()
    # CUDA never started: the queued call is taken back
    torch, calls, state, hooks = _fake_torch(initialised=False)
    PeakHistory.start(torch, torch.optim.optimizer).close()
    assert torch.cuda._queued_calls == [] and calls == []


def test_a_backward_the_test_replaced_is_left_and_errors_never_leave():
    torch, calls, state, hooks = _fake_torch()
    events = PeakHistory.start(torch, torch.optim.optimizer)
    mine = torch.autograd.backward = lambda *args: None
    events.close()
    assert torch.autograd.backward is mine
    # torch's history call fails (the cudaMallocAsync backend): said in the split, never raised
    torch, calls, state, hooks = _fake_torch()
    torch.cuda.memory._record_memory_history = lambda **kwargs: 1 / 0
    events = PeakHistory.start(torch, torch.optim.optimizer)
    assert events.split(0, 1) == {"error": "ZeroDivisionError: division by zero"}
    events.close()
    # a double without autograd (the plugin's own tests): nothing is recorded, the history is off again
    torch, calls, state, hooks = _fake_torch()
    del torch.autograd
    assert PeakHistory.start(torch, torch.optim.optimizer) is None and not state.on


# -- in the plugin --------------------------------------------------------------------------------

# FAKE_OPTIM (tests/test_pytest_plugin.py) with a history: the test double's allocations and frees
# are recorded while it is on, backward() frees a forward's saved tensors and makes the gradients,
# and "CUDA" starts at the first allocation, running the calls queued for it.
FAKE_HISTORY = FAKE_OPTIM + '''
import time

H = types.SimpleNamespace(on=False, trace=[], asked=[])
fake_torch.H = H

def _event(action, tensor):
    if H.on:
        H.trace.append({"action": action, "addr": tensor.untyped_storage().data_ptr(), "size": tensor.nbytes,
                        "time_us": time.time_ns() // 1000})

_init, _del = FakeTensor.__init__, FakeTensor.__del__

def _recorded_init(self, nbytes):
    if not S.initialised:
        S.initialised = True
        for call, _ in list(_queued):
            call()
    _init(self, nbytes)
    _event("alloc", self)

def _recorded_del(self):
    try:
        _event("free_requested", self)
    finally:
        _del(self)

class _FlatStorage(_Storage):  # (without FAKE_OPTIM's reference back to its tensor, which made a cycle)
    def __init__(self, tensor):
        self.ptr, self.size = next(_ptrs), tensor.nbytes
    def nbytes(self):
        return self.size

def _flat_storage(self):
    if "_storage_" not in self.__dict__:
        self._storage_ = _FlatStorage(self)
    return self._storage_

FakeTensor.__init__, FakeTensor.__del__ = _recorded_init, _recorded_del
FakeTensor.untyped_storage = _flat_storage
FakeTensor.get_device = lambda self: 0

_queued = []

def _lazy_call(fn):
    if S.initialised:
        fn()
    else:
        _queued.append((fn, []))

def _record(enabled="all", context="all", stacks="all", max_entries=0):
    H.asked.append((enabled, context, stacks, max_entries))
    H.on = enabled is not None
    if not H.on:
        H.trace.clear()

fake_torch.cuda._lazy_call, fake_torch.cuda._queued_calls = _lazy_call, _queued
fake_torch.cuda.memory = types.SimpleNamespace(_record_memory_history=_record)
fake_torch.cuda.memory_allocated = lambda index=0: S.allocated
fake_torch._C._cuda_isHistoryEnabled = lambda: H.on
fake_torch._C._cuda_memorySnapshot = lambda pool: {"device_traces": [list(H.trace)]}

class Loss:
    def __init__(self, params, *saved):
        self.params, self.saved = params, list(saved)

def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None):
    time.sleep(0.002)
    for p in tensors.params:
        p.grad = FakeTensor(p.nbytes)
    tensors.saved.clear()
    time.sleep(0.002)

fake_torch.Loss = Loss
fake_torch.autograd = types.SimpleNamespace(backward=backward)

_pre = {}

class _PreHandle:
    def __init__(self, key):
        self.key = key
    def remove(self):
        _pre.pop(self.key, None)

def register_optimizer_step_pre_hook(hook):
    key = object()
    _pre[key] = hook
    return _PreHandle(key)

class RecordedAdam(FakeAdam):
    def step(self):
        for hook in list(_pre.values()):
            hook(self, (), {})
        time.sleep(0.002)
        FakeAdam.step(self)
        time.sleep(0.002)

optimizer_module.register_optimizer_step_pre_hook = register_optimizer_step_pre_hook
optimizer_module.pre_hooks = _pre
fake_torch.optim.Adam = RecordedAdam
'''


def test_a_vram_limit_failure_says_what_filled_the_peak_itself_fake_torch(pytester):
    pytester.makeconftest(FAKE_HISTORY)
    pytester.makepyfile("""
        import sys

        import pytest
        import torch

        opt = sys.modules["torch.optim.optimizer"]
        MIB = 1 << 20
        ORIGINAL = torch.autograd.backward

        @pytest.mark.vram_limit("256MiB")
        def test_a_trains_over():  # "CUDA" starts here
            w = torch.empty(64 * MIB)
            adam = torch.optim.Adam([w])
            for _ in range(2):
                w.grad = None
                loss = torch.Loss([w], torch.empty(200 * MIB))  # a forward's activations
                torch.autograd.backward(loss)
                adam.step()

        @pytest.mark.vram_limit("64MiB")
        def test_b_no_step_over():
            x = torch.empty(100 * MIB)

        def test_c_all_undone():
            assert torch.autograd.backward is ORIGINAL and opt.hooks == {} and opt.pre_hooks == {}
            assert not torch.H.on and torch.cuda._queued_calls == []
            assert torch.H.asked == [("all", None, "python", 100000), (None, "all", "all", 0)] * 2

        def test_d_history_of_its_own():
            torch.cuda.memory._record_memory_history("all", max_entries=1000)

        @pytest.mark.vram_limit("64MiB")
        def test_e_over_with_it():
            x = torch.empty(100 * MIB)

        def test_f_left_on():
            assert torch.H.on and torch.H.asked[-1] == ("all", "all", "all", 1000)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines([
        "*_ test_a_trains_over _*",
        ("VRAM limit: cuda:0 peak allocated during this test was 456 MiB*above its vram_limit of 256 MiB* "
         "What filled it, at the peak itself, which came inside backward(): activations 200 MiB, optimizer state "
         "128 MiB, parameters 64.0 MiB, gradients 64.0 MiB."),
        "*_ test_b_no_step_over _*",
        "VRAM limit: cuda:0 peak allocated*What filled it, at the peak itself, which came outside backward()*: "
        "gathered, then freed 100 MiB.",
        "*_ test_e_over_with_it _*",
        "VRAM limit: cuda:0 peak allocated*What filled it, at the peak itself*: gathered, then freed 100 MiB.",
    ])


def test_backward_and_the_step_hooks_are_put_back_after_a_vram_limit_test_cpu(pytester):
    """Real torch on CPU: CUDA never starts, so no events are recorded, but the marks come and go, and
    the start queued for CUDA is taken back."""
    _need_torch()
    pytester.makepyfile("""
        import pytest
        import torch
        import torch.optim.optimizer as opt

        ORIGINAL = torch.autograd.backward

        def queued():
            return [c for c in torch.cuda._queued_calls if type(getattr(c[0], "__self__", None)).__name__ == "PeakHistory"]

        @pytest.mark.vram_limit("1GiB")
        def test_a_limited():
            assert torch.autograd.backward is not ORIGINAL and torch.autograd.backward.__wrapped__ is ORIGINAL
            assert len(opt._global_optimizer_pre_hooks) == 1 and len(queued()) == 1
            model = torch.nn.Linear(4, 4)
            sgd = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(1, 4)).sum().backward()
            sgd.step()
            assert model.weight.grad is not None

        def test_b_after():
            assert torch.autograd.backward is ORIGINAL
            assert len(opt._global_optimizer_pre_hooks) == 0 and len(opt._global_optimizer_post_hooks) == 0
            assert queued() == []
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly").assert_outcomes(passed=2)
