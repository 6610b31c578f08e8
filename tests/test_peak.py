"""What made the peak (issue 31): the agent's captures at new highs (_agent/peak/peak.py) over the torch
test double, its probe of the program's names over real CPU tensors, and the composition the
diagnosis makes of them (diagnosis/peak.py). The allocator figures here are SYNTHETIC; the parts
measured on a GPU are checked in tests/gpu/test_scenarios.py against the programs' own sums."""
from __future__ import annotations

import gc
import json
import sys
import threading
import time

import pytest

from gpumemdoctor._agent.peak import peak as agent_peak
from gpumemdoctor._agent import probe as agent_probe
from gpumemdoctor.diagnosis import peak
from gpumemdoctor.diagnosis.findings import PEAK_CATEGORIES, Breakdown
from gpumemdoctor.recording import records
from tests.test_agent_long import fake_cuda, records as agent_records

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def agent_and_clock(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path))


def captures(tmp_path, agent) -> list[dict]:
    return [r for r in agent_records(tmp_path, agent) if r["type"] == "peak"]


def test_a_capture_at_each_new_high_and_none_below_it(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    for level in (32 * MiB, 512 * MiB, 520 * MiB, GiB, 900 * MiB, 2 * GiB, 2 * GiB):
        clock.now += 0.05
        agent.shared.torch.set(level, level)
        agent.on_step(explicit=True)
    found = captures(tmp_path, agent)
    # 32 MiB is below MIN_BYTES; 520 MiB is within RISE of 512; 900 MiB and the repeat are no new highs.
    assert [c["reserved"] for c in found] == [512 * MiB, GiB, 2 * GiB]
    root = records.empty_root()
    for c in found:
        records.apply_record(root, "peak", c, 0.0)  # the declared shape reads them
    assert [c["n"] for c in root["peaks"]] == [1, 2, 3]
    assert agent.shared.cost["peak_capture_max_s"] > 0


def test_captures_stop_at_their_bound_and_late_ones_need_a_larger_rise(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    level = 256 * MiB
    for _ in range(200):
        level = int(level * 1.03) + 17 * MiB  # a new high at every step, 3% up
        clock.now += 0.05
        agent.shared.torch.set(level, level)
        agent.on_step(explicit=True)
    found = captures(tmp_path, agent)
    assert len(found) == agent_peak.MAX_CAPTURES
    late = found[agent_peak.LATE_CAPTURES:]
    assert all(b["reserved"] >= a["reserved"] * (1 + agent_peak.LATE_RISE) for a, b in zip(late, late[1:]))


def test_a_rise_after_the_last_sample_is_captured_at_exit(agent_and_clock, tmp_path):
    """A leak's highest moment is often its end: the exit's first reading is a capture when it is
    a new high, marked as read at the end (never in a pause), and the composition says so."""
    from gpumemdoctor._agent import exit as exit_probes

    agent, clock = agent_and_clock
    for level in (512 * MiB, GiB):
        clock.now += 0.05
        agent.shared.torch.set(level, level)
        agent.on_step(explicit=True)
    clock.now += 5.0  # the program grows on after its last step, then ends
    agent.shared.torch.set(3 * GiB, 3 * GiB)
    exit_probes.finish(agent)
    found = captures(tmp_path, agent)
    assert [c["reserved"] for c in found] == [512 * MiB, GiB, 3 * GiB]
    last = found[-1]
    assert last["inside"] == "exit" and last["where"] is None and last["paused"] is False
    root = records.empty_root()
    for c in found:
        records.apply_record(root, "peak", c, 0.0)
    composition, _ = peak.compose(_Agent(root["peaks"]), 0, breakdown(), "process 7 on GPU 0")
    assert composition.total_bytes >= 3 * GiB
    assert any("the exit's first reading" in n for n in composition.notes), composition.notes


def test_an_end_below_the_highest_capture_is_no_capture(agent_and_clock, tmp_path):
    from gpumemdoctor._agent import exit as exit_probes

    agent, clock = agent_and_clock
    clock.now += 0.05
    agent.shared.torch.set(2 * GiB, 2 * GiB)
    agent.on_step(explicit=True)
    agent.shared.torch.set(GiB, GiB)
    exit_probes.finish(agent)
    assert [c["reserved"] for c in captures(tmp_path, agent)] == [2 * GiB]


def test_the_capture_counts_the_stepped_optimizers_parts_once_each():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    seen: dict = {}
    p = sum(agent_peak._count(t, -1, seen, 1) for t in model.parameters())
    again = sum(agent_peak._count(t, -1, seen, 1) for t in model.parameters())
    state = sum(agent_peak._count(v, -1, seen, 3) for s in opt.state.values() for v in s.values())
    assert p == (64 * 64 + 64) * 4 and again == 0
    assert state == 2 * p + 2 * 4  # exp_avg, exp_avg_sq, and a 4-byte step count per parameter


def _probe(torch, deadline_s=1.0):
    return agent_probe.Probe(torch, time.perf_counter() + deadline_s, on_device=lambda t: True)


def test_the_probe_names_the_locals_the_modules_and_a_running_sum_s_graph():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))

    def evaluate():
        total = 0.0
        scratch = torch.empty(300_000)  # a local of a running function
        for _ in range(5):
            x = torch.randn(32, 256)
            total = total + model(x).square().mean()  # keeps each batch's graph
        return _probe(torch).run(), scratch, x

    found, scratch, x = evaluate()
    assert found["stopped"] is None and found["graphs"] == 1
    temporaries = {h[0]: h[1] for h in found["temporaries"]}
    assert temporaries["evaluate() local scratch"] == scratch.untyped_storage().nbytes()
    assert temporaries["evaluate() local x"] == x.untyped_storage().nbytes()
    assert "evaluate() local total (holds its autograd graph)" in temporaries
    assert found["parameters_bytes"] == sum(p.untyped_storage().nbytes() for p in model.parameters())


def test_the_probe_reads_an_object_s_public_attributes_and_counts_each_graph_s_nodes_once():
    torch = pytest.importorskip("torch")

    class Metric:
        pass

    def evaluate():
        worst = Metric()
        worst.batches = [torch.empty(1000) for _ in range(3)]  # a local object's attribute: one level down
        worst._cache = [torch.empty(7000)]  # private: not read
        worst.pairs = [(torch.empty(10), torch.empty(20))]  # a list of (images, losses): one level more
        model = torch.nn.Linear(4, 4)
        model.validation_step_outputs = [torch.empty(500), torch.empty(500)]  # a module's own list
        total = 0.0
        w = torch.randn(8, 8, requires_grad=True)
        for _ in range(10):
            loss = (w * 2).sum()
            total = total + loss  # keeps every batch's graph: 10 x (mul, sum, add) and w's AccumulateGrad
        return _probe(torch).run(), worst, model, total, loss

    found, worst, model, total, loss = evaluate()
    held = {h[0]: h for h in found["temporaries"]}
    assert held["evaluate() local worst.batches[*]"][1:4:2] == [3 * 4000, 3], held
    assert not any("_cache" in name for name in held)
    assert held["evaluate() local worst.pairs[*]"][1:4:2] == [120, 2], held
    assert held["evaluate() local model.validation_step_outputs[*]"][1] == 2 * 2000, held
    # total's graph chains its ten additions (one a batch); the last loss's own graph, one sum
    chains = {h[0]: h[5] for h in found["graph_holders"]}
    assert found["graph_holders"][0][0] == "evaluate() local total (holds its autograd graph)", chains
    assert chains["evaluate() local total (holds its autograd graph)"] == 10, chains
    assert chains.get("evaluate() local loss (holds its autograd graph)", 1) == 1, chains
    # nodes read: ten along total's chain (the last finds no more), one for the loss's
    assert found["graph_links"] == 11 and all(h[4] == 0 for h in found["graph_holders"]), found


def test_the_probe_reads_the_dicts_in_a_list_without_running_a_subclass_s_code():
    """A list of a model's outputs (hf_gpt2_kept_outputs on the H100: `history`, 4.3 GiB of
    transformers' ModelOutput dicts, was not read one level further, and its peak's table called it
    unclassified). A dict subclass is read as a dict: its own methods never run."""
    torch = pytest.importorskip("torch")
    ran = []

    class Output(dict):  # transformers' ModelOutput is an OrderedDict subclass with its own methods
        def values(self):
            ran.append("values")
            return super().values()

        def __getitem__(self, key):
            ran.append("getitem")
            return super().__getitem__(key)

        def __len__(self):  # (whether it is empty is asked of the dict, not of the subclass)
            ran.append("len")
            return super().__len__()

    class Trainer:
        pass

    def evaluate():
        history = [Output(logits=torch.empty(1000), loss=torch.empty(1)) for _ in range(4)]
        trainer = Trainer()
        trainer.outputs = [{"preds": torch.empty(250)} for _ in range(2)]  # an attribute: a list of dicts
        trainer.best = torch.empty(10)  # and a tensor: its attributes are read
        other = Trainer()
        other.log_history = [{"loss": torch.empty(250)}]  # a list of dicts alone: its __dict__ is not asked for
        return _probe(torch).run(), history, trainer, other

    found, history, trainer, other = evaluate()
    held = {h[0]: h for h in found["temporaries"]}
    assert held["evaluate() local history[*]"][1:4:2] == [4 * 4004, 8], held
    assert held["evaluate() local trainer.outputs[*]"][1:4:2] == [2 * 1000, 2], held
    # Python 3.11+ makes an object's __dict__ for good when it is first asked for (a container the
    # collector counts): an object whose attributes are only lists of dicts (a trainer's log
    # history, a config) is common, and left alone
    assert not any(name.startswith("evaluate() local other") for name in held), held
    assert ran == []


def test_the_probe_reads_no_tensor_subclass_with_a_torch_function_of_its_own_and_no_proxy_s_class():
    """Reading such a tensor's attributes would run its __torch_function__; asking a proxy for its
    __class__ (isinstance does) would run the proxy's code."""
    torch = pytest.importorskip("torch")
    ran = []

    class Traced(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            ran.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    class Proxy:
        @property
        def __class__(self):
            ran.append("__class__")
            return list

    def evaluate():
        traced = torch.empty(100).as_subclass(Traced)
        proxy = Proxy()
        plain = torch.empty(10)
        return _probe(torch).run(), traced, proxy, plain

    found, *_ = evaluate()
    held = {h[0]: h[1] for h in found["temporaries"]}
    assert held == {"evaluate() local plain": 40} and ran == [], (held, ran)


def test_the_probe_keeps_nothing_alive_that_the_program_let_go_of():
    """Python 3.11 and 3.12 keep a frame's f_locals snapshot until the frame returns: a tensor the
    function deleted after the probe would live on in it."""
    torch = pytest.importorskip("torch")
    import weakref

    def prepare():
        wide = torch.empty(1000)
        gone = weakref.ref(wide)
        _probe(torch).run()
        del wide
        return gone() is None

    assert prepare()


def test_the_probe_leaves_a_frame_s_locals_to_a_tracer():
    torch = pytest.importorskip("torch")

    def prepare():
        wide = torch.empty(1000)
        previous = sys.gettrace()
        sys.settrace(lambda *a: None)
        try:
            found = _probe(torch).run()
        finally:
            sys.settrace(previous)
        return found, wide

    found, _ = prepare()
    assert found["temporaries"] == []  # a tracer refreshes and writes back the snapshot: not touched


def test_the_probe_runs_on_the_main_thread_when_the_agent_s_thread_asks(agent_and_clock, tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("pending calls run on the main thread")
    agent, clock = agent_and_clock
    agent.shared.torch.nn = type("nn", (), {"Module": type("Module", (), {})})
    clock.now += 1
    agent.shared.torch.set(GiB, GiB)
    sampling = threading.Thread(target=agent.sampler._sample, args=("time", True), name="gpumemdoctor-agent")
    sampling.start()
    sampling.join()
    for _ in range(1000):  # the program's bytecodes: the pending call runs between two of them
        pass
    probes = [r for r in agent_records(tmp_path, agent) if r["type"] == "peak_probe"]
    assert len(probes) == 1 and probes[0]["n"] == 1 and "error" not in probes[0], probes
    root = records.empty_root()
    records.apply_record(root, "peak_probe", probes[0], 0.0)


def _result_of(kind: str, ask):
    """The main thread's place when a call asked of it from another thread runs: inside
    lock.acquire (a call that lets the GIL go, as a CUDA operation does), in each shape of
    statement. The asker asks once the main thread waits there, then lets it go on."""
    lock = threading.Lock()
    lock.acquire()
    code = (_returned if kind == "return f()" else _result_of).__code__
    main = threading.get_ident()

    def asker():
        until = time.perf_counter() + 5
        while time.perf_counter() < until:
            frame = sys._current_frames().get(main)
            if frame is not None and frame.f_code is code:  # waiting in lock.acquire, called from here
                break
            time.sleep(0.001)
        ask()
        lock.release()

    helper = threading.Thread(target=asker)
    helper.start()
    holder = type("Holder", (), {})()
    if kind == "x = f()":
        x = lock.acquire()
        del x
    elif kind == "o.x = f()":
        holder.x = lock.acquire()
    elif kind == "return f()":
        _returned(lock)
    else:  # "xs.append(f())": the list holds it once the call returns
        xs = []
        xs.append(lock.acquire())
    helper.join()


def _returned(lock):
    return lock.acquire()


def test_a_call_s_result_about_to_be_named_is_told_from_one_already_held():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("pending calls run on the main thread")
    from gpumemdoctor._agent import main_thread

    seen = []
    callback, add = main_thread.pending_call(lambda _: seen.append(main_thread.binding(sys._getframe(1))) or 0)
    for kind in ("x = f()", "o.x = f()", "return f()", "xs.append(f())"):
        _result_of(kind, lambda: main_thread.ask(add, callback))
        for _ in range(1000):  # the program's bytecodes: the pending call runs between two of them
            pass
    assert seen == [True, True, True, False]


@pytest.mark.parametrize("then", ["time sample", "step sample", "deferred enough", "in a library"])
def test_the_probe_waits_for_a_new_high_s_tensor_to_be_named(agent_and_clock, tmp_path, then, monkeypatch):
    """A new high seen while the call that made it runs: the probe, asked then, runs as the call
    returns, before its result is named. It probes what the names hold then, and once more at the
    next sample (the agent's thread asks again; a step sample probes at once, on the program's
    thread), which names the result. Put off MAX_DEFERRED times already (here: none allowed), it
    runs once, at once; so it does when the call returns into a library's frame (the probe reads no
    library's locals)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("pending calls run on the main thread")
    torch = pytest.importorskip("torch")
    agent, clock = agent_and_clock
    agent.shared.torch.nn = torch.nn
    agent.shared.torch.Tensor = torch.Tensor
    agent.shared.torch._C = torch._C
    watch = agent.peak_watch
    # tensors on the CPU count as the capture's device here
    watch.pending_device = 0
    real_probe = agent_probe.Probe

    def cpu_probe(torch_, deadline, on_device=None):
        return real_probe(torch_, deadline, on_device=lambda t: True)

    made = torch.futures.Future()
    test_code = sys._getframe().f_code
    library: dict = {}
    exec(compile("def wait(future, c_wait):\n    got = c_wait(future)\n    return got\n",
                 "/usr/lib/python3/site-packages/some_library.py", "exec"), library)
    if then == "in a library":
        test_code = library["wait"].__code__

    def operation():  # the agent's thread samples while the program waits for a result
        from gpumemdoctor._agent import main_thread

        main_ident = threading.main_thread().ident
        until = time.monotonic() + 5
        while time.monotonic() < until:  # until the program is inside made.wait(), called from the test
            frame = sys._current_frames()[main_ident]
            if frame.f_code is test_code and main_thread.binding(frame):
                break
            time.sleep(0.001)
        clock.now += 1
        agent.shared.torch.set(GiB, GiB)
        agent.sampler._sample("time", True)
        made.set_result(torch.ones(1024))

    agent_peak.Probe = cpu_probe
    if then == "deferred enough":
        monkeypatch.setattr(agent_peak, "MAX_DEFERRED", 0)
    try:
        asker = threading.Thread(target=operation, name="gpumemdoctor-agent")
        asker.start()
        # a C call from the program's own code that lets the GIL go, as a CUDA operation does, and
        # returns a tensor (Future.wait's Python wrapper would be a library's frame)
        if then == "in a library":
            wide = library["wait"](made, torch._C.Future.wait)
        else:
            wide = torch._C.Future.wait(made)
        asker.join()
        for _ in range(1000):
            pass
        first = [r for r in agent_records(tmp_path, agent) if r["type"] == "peak_probe"]
        if then in ("deferred enough", "in a library"):
            assert len(first) == 1 and watch.retry == 0 and watch.deferred == 0, first  # at once
            return
        # at once, before the result has its name: what the names held then
        assert len(first) == 1 and watch.retry == 1 and watch.deferred == 1, first
        assert not any("local wide" in h[0] for h in first[0]["temporaries"]), first
        if then == "time sample":
            again = threading.Thread(target=agent.sampler._sample, args=("time", True), name="gpumemdoctor-agent")
            again.start()
            again.join()
        else:
            clock.now += 0.01
            # at a step boundary, on the program's thread; put off (None) while the collector is
            # near its threshold, and taken at a later boundary, after the collection that comes
            while agent.sampler._sample("step", False) is None:
                gc.collect()
        for _ in range(1000):
            pass
    finally:
        agent_peak.Probe = real_probe
    probes = [r for r in agent_records(tmp_path, agent) if r["type"] == "peak_probe"]
    assert len(probes) == 2 and probes[0]["n"] == probes[1]["n"] == 1, probes
    named = [h[0] for h in probes[1]["temporaries"]]
    assert any("local wide" in n for n in named), probes[1]
    assert watch.retry == 0
    # the diagnosis takes the one that found the most: the second
    from gpumemdoctor.diagnosis import probed

    class Recorded:
        root = {"peak_probes": probes}

    assert probed.probe_of(Recorded, 1) is probes[1]
    del wide


# -- the composition (diagnosis/peak.py), from SYNTHETIC records ------------------------------------

class _Agent:
    def __init__(self, peaks, probes=(), libraries=(), investigations=()):
        self.pid = 7
        self.root = {"peaks": list(peaks), "peak_probes": list(probes), "libraries": list(libraries), "groups": [],
                     "investigations": list(investigations)}

    def device(self, torch_index):
        return type("D", (), {"nvml_index": 0})()


def capture(n=1, **kw) -> dict:
    base = {"n": n, "t": 5.0, "step": 10, "device": 0, "allocated": 3 * GiB, "reserved": 4 * GiB, "nvml": 5 * GiB,
            "allocated_peak": 3 * GiB, "inactive_split": 0, "parameters": GiB // 2, "gradients": GiB // 2,
            "optimizer_state": GiB, "optimizers": [["AdamW", GiB // 2, GiB // 2, GiB]], "where": "train.py:9 in main()",
            "inside": None, "paused": False}
    return {**base, **kw}


def breakdown(context=600 * MiB) -> Breakdown:
    return Breakdown(pid=7, device=0, torch_index=0, nvml_bytes=None, context_bytes=context)


def test_the_parts_add_up_to_the_highest_capture():
    agent = _Agent([capture(1, nvml=3 * GiB, reserved=2 * GiB, allocated=2 * GiB), capture(2)])
    c, found = peak.compose(agent, 0, breakdown(), "process 7 on GPU 0")
    got = {p.category: p.bytes for p in c.parts}
    assert c.step == 10 and c.total_bytes == 5 * GiB == sum(got.values())
    assert got["optimizer-state"] == 2 * got["parameters"]
    assert got["unclassified"] == GiB  # 3 GiB allocated less parameters, gradients and state
    assert got["cache"] == GiB and got["context"] == 600 * MiB
    assert got["outside-pytorch"] == 5 * GiB - 4 * GiB - 600 * MiB
    assert [p.category for p in c.parts] == [k for k in PEAK_CATEGORIES if k in got]
    assert any("no probe" in n for n in c.notes) and found == []


def search(t, step, graph_bytes, other_bytes=0) -> dict:
    holders = [{"path": "thread 'MainThread': evaluate() at eval.py local total", "pattern": "p", "kind": "autograd-graph",
                "count": 300, "bytes": graph_bytes, "sizes": []}]
    if other_bytes:
        holders.append({"path": "__main__.kept", "pattern": "q", "kind": "global", "count": 1, "bytes": other_bytes,
                        "sizes": []})
    return {"when": "phase", "t": t, "step": step, "groups": [{"device": 0, "frames": [["/x/eval.py", 12, "evaluate"]],
                                                               "holders": holders}]}


def test_graphs_come_from_a_search_in_the_same_pause_and_fit_inside_the_allocated_memory():
    probe = {"n": 2, "t": 5.01, "elapsed_s": 0.004, "stopped": None,
             "temporaries": [["evaluate() local x", 10 * MiB, "eval.py:11"]], "temporaries_bytes": 10 * MiB}
    searches = [search(4.0, 10, GiB // 2), search(4.5, 10, 3 * GiB), search(4.6, 9, 9 * GiB), search(6.0, 10, 9 * GiB)]
    agent = _Agent([capture(2, paused=True)], [probe], investigations=searches)
    c, found = peak.compose(agent, 0, breakdown(), "process 7 on GPU 0")
    got = {p.category: p.bytes for p in c.parts}
    # The search of this pause (step 10) before the reading that found the most: 3 GiB, cut to the 1 GiB left.
    assert got["graphs-kept"] == GiB and "temporaries" not in got and "unclassified" not in got
    graphs = c.part("graphs-kept")
    assert graphs.holders[0]["name"].startswith("thread 'MainThread': evaluate()") and graphs.holders[0]["line"] == "eval.py:12"
    assert any("0.5 s before this moment" in n for n in c.notes), c.notes
    kinds = {f.kind for f in found}
    assert kinds == {"state-at-evaluation", "avoidable-peak"}
    graphs_finding = next(f for f in found if f.kind == "avoidable-peak")
    assert "evaluate() at eval.py local total (eval.py:12)" in graphs_finding.summary


def test_probe_parts_fit_inside_what_is_left_and_say_when_cut():
    probe = {"n": 1, "t": 5.0, "elapsed_s": 0.004, "temporaries": [["f() local y", 2 * GiB, "f.py:3"]],
             "temporaries_bytes": 2 * GiB}
    c, _ = peak.compose(_Agent([capture(1)], [probe]), 0, breakdown(), "p")
    assert c.part("temporaries").bytes == GiB and c.part("unclassified") is None
    assert any("cut to fit" in n for n in c.notes)


def test_fragmentation_and_a_large_temporary_are_findings_small_ones_are_not():
    probe = {"n": 1, "t": 5.0, "elapsed_s": 0.001, "temporaries": [["prepare() local wide", GiB, "p.py:4"]],
             "temporaries_bytes": GiB}
    agent = _Agent([capture(1, parameters=0, gradients=0, optimizer_state=0, optimizers=[],
                            inactive_split=700 * MiB)], [probe])
    c, found = peak.compose(agent, 0, breakdown(), "process 7 on GPU 0")
    assert {f.kind for f in found} == {"fragmented-peak", "temporary-peak"}
    small = _Agent([capture(1, inactive_split=100 * MiB)])
    assert peak.compose(small, 0, breakdown(), "process 7 on GPU 0")[1] == []
    # a local's list of a run's batches (vision_dataloader_metric.py on the H100: 1.18 GiB in
    # main() local worst.batches[*]) is an accumulation, not a temporary to free sooner
    gathered = {"n": 1, "t": 5.0, "elapsed_s": 0.001, "temporaries_bytes": GiB,
                "temporaries": [["main() local worst.batches[*]", GiB, "m.py:61", 358, 0]]}
    agent = _Agent([capture(1, parameters=0, gradients=0, optimizer_state=0, optimizers=[])], [gathered])
    assert peak.compose(agent, 0, breakdown(), "process 7 on GPU 0")[1] == []


def test_no_capture_no_composition_and_a_missing_context_is_said():
    assert peak.compose(_Agent([]), 0, breakdown(), "p") == (None, [])
    # readings no GPU could give (a corrupt record: the property tests' mutated run folders): the parts
    # would add up past what a report may hold, and none is made
    huge = capture(nvml=None, reserved=1 << 60, allocated=1 << 59)
    assert peak.compose(_Agent([huge]), 0, breakdown(), "p") == (None, [])
    c, _ = peak.compose(_Agent([capture(nvml=None)]), 0, breakdown(context=None), "p")
    assert c.total_bytes == 4 * GiB and any("context was not read" in n for n in c.notes)


def test_the_allocated_peak_counter_above_the_reading_is_kept_and_drawn():
    from gpumemdoctor.reporters import terminal

    probe = {"n": 1, "t": 5.0, "elapsed_s": 0.001}
    c, _ = peak.compose(_Agent([capture(allocated_peak=3 * GiB + 700 * MiB, inside="backward")], [probe]), 0,
                        breakdown(), "p")
    assert c.allocated_peak_bytes == 3 * GiB + 700 * MiB
    assert "700 MiB above this moment" in terminal.allocated_peak_note(c)
    assert "inside backward()" in c.part("unclassified").how
    # without a probe, kept tensors and graphs are in the rest too: where it was read tells nothing
    c, _ = peak.compose(_Agent([capture(inside="backward")]), 0, breakdown(), "p")
    assert c.part("unclassified").how == peak.HOW["unclassified"]
    # a few MiB above the moment are its own small tensors come and gone: not said
    c, _ = peak.compose(_Agent([capture(allocated_peak=3 * GiB + 3 * MiB)]), 0, breakdown(), "p")
    assert terminal.allocated_peak_note(c) is None


def evaluation_then_cache(**after) -> list[dict]:
    """An evaluation at its height (16 GiB allocated), then the next new high just after it let go:
    its memory is the allocator's cache, and PyTorch's allocated peak counter says it rose higher."""
    height = capture(1, t=12.8, allocated=16 * GiB, reserved=16 * GiB, nvml=17 * GiB, allocated_peak=16 * GiB,
                     paused=True)
    later = capture(2, t=12.9, allocated=GiB, reserved=18 * GiB, nvml=18 * GiB + 800 * MiB,
                    allocated_peak=17 * GiB + 600 * MiB, paused=False)
    return [height, {**later, **after}]


def test_an_evaluation_s_peak_is_read_at_its_height_when_the_highest_reading_is_its_cache():
    from gpumemdoctor.diagnosis.ci_checks import largest_peak
    from gpumemdoctor.app.report_file import PEAK_COMPOSITION

    c, _ = peak.compose(_Agent(evaluation_then_cache()), 0, breakdown(), "process 7 on GPU 0")
    assert c.t == 12.8 and c.in_pause and c.total_bytes == 17 * GiB
    assert c.part("cache") is None  # reserved == allocated at the height
    note = next(n for n in c.notes if n.startswith("the reading with the most memory in use"))
    assert "NVML's highest, 18.8 GiB at 12.9 s, held 17.0 GiB of PyTorch's cache" in note, note
    assert "rose 1.59 GiB above this reading's at a moment between the two" in note, note
    assert "one of 2 readings made at new highs of this process's memory" in c.notes
    # the peak itself is still NVML's highest: it ranks the processes, and the report keeps it
    assert c.highest == {"t": 12.9, "total_bytes": 18 * GiB + 800 * MiB, "cache_bytes": 17 * GiB}
    assert c.peak_bytes == 18 * GiB + 800 * MiB
    other = peak.compose(_Agent([capture(1, nvml=18 * GiB)]), 0, breakdown(), "p")[0]
    assert largest_peak([other, c]) is c  # 18.8 GiB at its peak, though 17 GiB is described
    assert PEAK_COMPOSITION(json.loads(json.dumps(c.to_json())), "c") == c


def test_without_nvml_the_highest_reading_is_not_called_nvml_s_and_a_missing_counter_keeps_it():
    captures = evaluation_then_cache(nvml=None)
    captures[0]["nvml"] = None
    c, _ = peak.compose(_Agent(captures), 0, breakdown(), "p")
    note = next(n for n in c.notes if n.startswith("the reading with the most memory in use"))
    assert "the highest reading, 18.6 GiB at 12.9 s" in note and "NVML" not in note, note
    # without the allocated peak counter, nothing says one moment filled the cache: the highest stays
    c, _ = peak.compose(_Agent(evaluation_then_cache(allocated_peak=None)), 0, breakdown(), "p")
    assert c.t == 12.9 and c.highest is None


@pytest.mark.parametrize("after, why", [
    # tensors of varying shapes: each size cached apart, a cache that no moment filled (the counter
    # below ONE_MOMENT of reserved): the cache itself made the peak
    ({"reserved": 24 * GiB, "nvml": 25 * GiB, "allocated_peak": 16 * GiB + 100 * MiB}, "no moment filled the cache"),
    # a capture hardly busier: the highest stays (BUSIER_BYTES, BUSIER_SHARE)
    ({"allocated": 15 * GiB, "reserved": 16 * GiB + 512 * MiB, "nvml": 17 * GiB + 512 * MiB,
      "allocated_peak": 16 * GiB + 100 * MiB}, "hardly busier"),
    # a cache of less than half the highest: the highest is not mostly what an earlier moment left
    ({"allocated": 8 * GiB, "reserved": 16 * GiB, "nvml": 17 * GiB + 512 * MiB,
      "allocated_peak": 16 * GiB + 100 * MiB}, "not mostly cache"),
])
def test_the_highest_reading_stays_unless_a_busier_one_tells_more(after, why):
    c, _ = peak.compose(_Agent(evaluation_then_cache(**after)), 0, breakdown(), "p")
    assert c.t == 12.9 and c.highest is None, why
    assert not any(n.startswith("the reading with the most memory in use") for n in c.notes), c.notes
    assert "the highest of 2 readings made at new highs of this process's memory" in c.notes


def test_a_busier_reading_must_have_256_mib_more_in_use_even_in_a_small_process():
    """BUSIER_BYTES on its own: 10% of a 1 GiB peak is 102 MiB; 200 MiB more in use is not enough."""
    later = capture(2, t=1.1, allocated=200 * MiB, reserved=800 * MiB, nvml=GiB, allocated_peak=650 * MiB,
                    inactive_split=0)  # 600 MiB of cache, 424 MiB in use
    height = capture(1, t=1.0, allocated=400 * MiB, reserved=400 * MiB, nvml=624 * MiB, allocated_peak=400 * MiB)
    c, _ = peak.compose(_Agent([height, later]), 0, breakdown(context=200 * MiB), "p")
    assert c.t == 1.1 and c.highest is None
    height.update(allocated=500 * MiB, reserved=500 * MiB, nvml=724 * MiB, allocated_peak=500 * MiB)
    c, _ = peak.compose(_Agent([height, later]), 0, breakdown(context=200 * MiB), "p")
    assert c.t == 1.0 and c.highest is not None  # 300 MiB more in use


def test_an_unclassified_part_names_the_graph_the_probe_found_repeating_one_operation():

    probe = {"n": 1, "t": 5.0, "elapsed_s": 0.001, "graph_links": 40,
             "graph_holders": [["evaluate() local total (holds its autograd graph)", 4, "eval.py:34", 1, 0, 32]]}
    c, _ = peak.compose(_Agent([capture(1, paused=True)], [probe]), 0, breakdown(), "p")
    assert peak.unclassified_told(c.part("unclassified")) == (
        "read while evaluate() at eval.py:34 local total carried an autograd graph that chains 32+ operations "
        "of one kind")
    short = {**probe, "graph_holders": [["evaluate() local total (holds its autograd graph)", 4, "eval.py:34", 1, 0, 3]]}
    c, _ = peak.compose(_Agent([capture(1, paused=True)], [short]), 0, breakdown(), "p")
    assert peak.unclassified_told(c.part("unclassified")) == ""  # 3 links: no accumulation


def test_an_optimizer_s_step_is_said_to_hold_its_temporaries_only_up_to_its_own_size():
    """hf_gpt2_kept_outputs on the H100: 4.38 GiB unclassified, read inside AdamW's step, of a model
    whose parameters, gradients and state came to 258 MiB: not its temporaries."""
    probe = {"n": 1, "t": 5.0, "elapsed_s": 0.001}
    small = capture(1, inside="optimizer step")  # 2 GiB of the optimizer's own, 1 GiB left
    c, _ = peak.compose(_Agent([small], [probe]), 0, breakdown(), "p")
    assert peak.unclassified_told(c.part("unclassified")) == "read inside an optimizer's step: its temporaries"
    big = capture(1, inside="optimizer step", parameters=64 * MiB, gradients=64 * MiB, optimizer_state=128 * MiB,
                  optimizers=[["AdamW", 64 * MiB, 64 * MiB, 128 * MiB]])
    c, _ = peak.compose(_Agent([big], [probe]), 0, breakdown(), "p")
    assert peak.unclassified_told(c.part("unclassified")) == (
        "read inside an optimizer's step, more than its parameters, gradients and state together (256 MiB): "
        "held further than the probe reads (names, and one level below them)")


def test_a_capture_without_a_probe_is_told_by_one_made_earlier_in_its_pause():
    """hf_eval_without_no_grad on the H100: the evaluation's highest reading got no probe (the program
    ended first); the one 0.08 s before, in the same pause, had found its running sum."""
    graph = {"n": 1, "t": 5.0, "elapsed_s": 0.001, "graph_links": 40,
             "graph_holders": [["evaluate() local total (holds its autograd graph)", 4, "eval.py:34", 1, 0, 32]]}
    first = capture(1, t=4.92, paused=True, allocated=2 * GiB, nvml=4 * GiB)
    c, _ = peak.compose(_Agent([first, capture(2, paused=True)], [graph]), 0, breakdown(), "p")
    assert c.t == 5.0 and any("no probe" in n for n in c.notes)
    assert peak.unclassified_told(c.part("unclassified")) == (
        "read 0.08 s after a probe in the same pause found evaluate() at eval.py:34 local total carrying an "
        "autograd graph that chains 32+ operations of one kind")
    for other in ({"step": 9}, {"paused": False}, {"t": 3.9}):  # another pause, none, too long before
        c, _ = peak.compose(_Agent([{**first, **other}, capture(2, paused=True)], [graph]), 0, breakdown(), "p")
        assert peak.unclassified_told(c.part("unclassified")) == "", other


@pytest.mark.parametrize("cublas, shown", [
    # leak_training_list on the H100: 65.0 MiB unclassified in an optimizer's step, all of it cuBLAS's
    # workspaces as measured at exit (the exit's breakdown: 65.0 MiB of the live tensors)
    (GiB, "cuBLAS workspaces at exit 1.00 GiB"),
    # peak_adamw: 577 MiB unclassified, 65.0 MiB of it the workspaces, the rest AdamW's temporaries
    (65 * MiB, "cuBLAS workspaces at exit 65.0 MiB; the rest read inside an optimizer's step: its temporaries"),
    (None, "read inside an optimizer's step: its temporaries"),
    # more than the part: the peak came before some of them were made; not named
    (GiB + 65 * MiB, "read inside an optimizer's step: its temporaries"),
])
def test_unclassified_memory_names_cublas_s_workspaces_as_measured_at_exit(cublas, shown):

    b = breakdown()
    b.cublas_workspace_bytes = cublas
    c, _ = peak.compose(_Agent([capture(inside="optimizer step")], [{"n": 1, "t": 5.0, "elapsed_s": 0.001}]), 0, b, "p")
    part = c.part("unclassified")
    assert part.bytes == GiB  # the parts still add up: the workspaces are named inside the rest, not moved
    assert sum(p.bytes for p in c.parts) == c.total_bytes
    assert peak.unclassified_told(part) == shown
    if cublas and cublas <= GiB:
        assert part.holders == [{"name": "cuBLAS workspaces at exit", "bytes": cublas, "line": None}]
        assert "not read at this moment" in part.how
    else:
        assert part.holders == [] and "cuBLAS" not in part.how




def test_a_probe_barely_moves_the_collector_s_count(agent_and_clock, tmp_path):
    """A probe holds automatic collection off and makes few containers of its own (no list of the
    names it walks; the first version made one and moved the count by 27 and more here), so the
    program's next automatic collection comes at most a few allocations early, at most MAX_PROBES
    times in a run."""
    import gc

    agent, clock = agent_and_clock
    agent.shared.torch.nn = type("nn", (), {"Module": type("Module", (), {})})
    keep = [[] for _ in range(50)]  # the program's names: what the probe walks
    was = gc.isenabled()
    gc.disable()
    try:
        moved = []
        for n in range(3):
            before = gc.get_count()[0]
            agent.peak_watch.probe(n + 1)
            moved.append(gc.get_count()[0] - before)
    finally:
        if was:
            gc.enable()
    probes = [r for r in agent_records(tmp_path, agent) if r["type"] == "peak_probe"]
    assert len(probes) == 3 and not any("error" in p for p in probes), probes
    # The first also makes the interpreter create, for each frame of the stack it walks, a frame
    # object and (Python 3.11, 3.12) the snapshot of its locals, where nothing asked for them before
    # (they live until their frames return, as a traceback's would); the later ones find them made.
    # (depth + 8 was seen exceeded, 45-46 at a depth of 33, in a whole serial run of the suite, with
    # this session's agent and with the one before it alike.)
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    assert moved[0] <= 2 * depth + 8 and all(abs(m) <= 8 for m in moved[1:]), (moved, depth)
    del keep


def test_the_probe_looks_at_its_budget_inside_a_long_list_and_reads_few_graph_nodes():
    """A list of 4,096 losses that keep their graphs: the probe stops at its budget inside the list
    (it ran 89.9 ms against 8 before it looked there), and reads at most MAX_LINKS graph nodes."""
    torch = pytest.importorskip("torch")


    w = torch.randn(4, requires_grad=True)

    def evaluate():
        losses = [(w * i).sum() for i in range(4096)]
        return _probe(torch, deadline_s=0.0005).run(), losses

    found, _ = evaluate()
    assert found["stopped"] == "time", found
    assert found["graph_links"] <= agent_probe.MAX_LINKS


def test_the_probe_reads_a_dict_in_a_list_only_when_it_starts_with_a_tensor_and_keeps_to_its_budget():
    """big_heap_lru_cache on the H100: a heap of dicts made each probe 3.2 ms instead of 0.9, and one
    21.7 ms against its 8, when the dicts in a list were read whatever they held."""
    torch = pytest.importorskip("torch")

    def evaluate():
        row = {f"k{j}": j for j in range(4096)}  # a dict of numbers, 4,096 times (one object: little memory)
        records = [row] * 4096  # read value by value: 16.8 million looks, past the 0.2 s below
        outputs = [{"logits": torch.empty(10), "loss": torch.empty(1)}]
        return _probe(torch, deadline_s=0.2).run(), records, outputs

    found, *_ = evaluate()
    assert found["stopped"] is None and {h[0]: h[1] for h in found["temporaries"]} == {"evaluate() local outputs[*]": 44}

    # 300 things that are not tensors, then a tensor: past its budget, the walk stops inside the list
    things = [object() for _ in range(300)] + [torch.empty(10)]
    late = _probe(torch, deadline_s=-1.0)
    late._value(things, "things", None, "temporaries")
    assert late.stopped == "time" and late.tensors == 0


def test_a_list_s_tensors_go_to_one_holder_with_and_one_without_a_graph_each_storage_once():
    """A container's tensors go to two holders: those that carry a graph apart from the plain ones,
    a storage that two items share counted once, a graph with no bytes of its own still named (its
    chain is evidence), and the longest chain among them kept."""
    torch = pytest.importorskip("torch")
    w = torch.randn(16, requires_grad=True)

    def make():  # (no other name of the probed frames holds these)
        base = torch.empty(100)
        running = w * 1
        for _ in range(3):
            running = running + w  # a chain of three additions
        return [torch.empty(10), base, base[:50], (w * 2).sum(), running, running.view(4, 4)]

    def evaluate():
        kept = make()
        return _probe(torch).run(), kept

    found, kept = evaluate()
    holders = {h[0]: h for h in found["temporaries"]}
    plain = holders["evaluate() local kept[*]"]
    graph = holders["evaluate() local kept[*] (holds its autograd graph)"]
    assert plain[1] == 40 + 400 and plain[3] == 2  # base's view: its storage counted once
    assert graph[1] == 4 + 64 and graph[3] == 2 and graph[5] == 3  # the view of `running` adds no bytes
    assert found["graphs"] == 3 and sum(h[1] for name, h in holders.items() if "kept" in name) == 40 + 400 + 4 + 64


def test_a_container_or_object_reached_by_several_names_is_read_once_by_the_first():
    """The model a program passes down its own functions is a local of each of their frames: its
    list of kept outputs is read once, under the first name the probe meets (the innermost frame's
    first local), not once a frame and once again under `kept`. Its bytes, tensors and graphs are
    counted once either way; the other names add no holder of their own."""
    torch = pytest.importorskip("torch")
    w = torch.randn(8, requires_grad=True)

    class Model:
        def __init__(self):
            self.outputs = [w * (i + 1) for i in range(50)]

    def inner(model):
        kept = model.outputs
        return _probe(torch).run(), kept

    def outer(model):
        return inner(model)

    model = Model()
    found, kept = outer(model)
    holders = {h[0]: h for h in found["temporaries"] + found["graph_holders"] if h[0].endswith("graph)")}
    assert list(holders) == ["inner() local model.outputs[*] (holds its autograd graph)"], holders
    assert holders["inner() local model.outputs[*] (holds its autograd graph)"][1:4:2] == [50 * 32, 50]
    assert found["graphs"] == 50  # each tensor looked at once: not again through model.outputs, thrice


def test_the_probe_does_not_look_through_a_list_of_lists_of_numbers():
    """Only a list whose items start with a tensor is read item by item one level further: a
    dataset kept as lists of floats (5,000 x 1,000 here) costs the probe one look per list."""
    torch = pytest.importorskip("torch")

    def evaluate():
        rows = [[0.5] * 1000 for _ in range(5000)]
        pairs = [(torch.empty(3), torch.empty(5))]
        return _probe(torch, deadline_s=0.2).run(), rows, pairs

    found, *_ = evaluate()
    # read within a budget of 0.2 s, after the rows (four million looks would have run past it)
    assert found["stopped"] is None and {h[0]: h[1] for h in found["temporaries"]} == {"evaluate() local pairs[*]": 32}


def test_a_sample_that_saw_a_fast_evaluations_graphs_does_not_hide_their_split():
    """tests/fixtures/caught/fast_eval_without_no_grad_sampled.json: a sample landed on the graphs at
    their height, 8 ms after the allocated peak, and left them unclassified. The events' split is
    shown (as much in use, less unclassified), the avoidable peak is found, and the name whose graph
    kept them, read by that sample's probe, is said."""
    from pathlib import Path

    from gpumemdoctor.diagnosis.diagnose import diagnose
    from gpumemdoctor.recording.recording import Recording

    report = json.loads((Path(__file__).parent / "fixtures" / "caught" /
                         "fast_eval_without_no_grad_sampled.json").read_text())
    recording = Recording.from_json(report["recording"])
    diagnosis = diagnose(recording)
    (c,) = [c for c in diagnosis.peak_compositions if c.pid == recording.target_pid]
    assert c.notes[0].startswith("split at PyTorch's allocated peak")
    assert c.part("gathered").bytes >= 470 << 20 and c.part("unclassified") is None
    (f,) = [f for f in diagnosis.findings if f.kind == "avoidable-peak"]
    assert f.bytes == c.part("gathered").bytes and "torch.no_grad()" in f.remedy
    (note,) = [n for n in c.notes if n.startswith("what kept the gathered tensors")]
    assert "after the peak, in the same step" in note
    assert "evaluate() at fast_eval_without_no_grad.py:28 local total carrying an autograd graph" in note


def test_the_optimizers_named_at_the_allocated_peak_get_its_figure_or_say_whose_figures_they_are():
    """The split at the allocated peak knows each part's bytes, not its optimizers: they are named from
    the nearest reading that read them. One optimizer holds all of a part; several keep that reading's
    figures, with a note where those differ from the part's by more than a tenth."""
    from gpumemdoctor.diagnosis.findings import PeakPart

    class Split:
        t = 5.0

        def __init__(self, parts):
            self.parts = {p.category: p for p in parts}
            self.notes = []

        def part(self, category):
            return self.parts.get(category)

    def agent(rows):
        return type("A", (), {"root": {"peaks": [{"device": 0, "t": 1.0, "optimizers": [["Old", 1, 1, 1]]},
                                                 {"device": 0, "t": 4.5, "optimizers": rows}]}})()

    one = Split([PeakPart("gradients", 8 * MiB, "", []), PeakPart("optimizer-state", 200 * MiB, "", [])])
    peak._optimizers_named(one, agent([["AdamW", 100 * MiB, 100 * MiB, 3 * 1024]]), 0)
    assert one.part("gradients").holders == [{"name": "AdamW's parameters' .grad", "bytes": 8 * MiB, "line": None}]
    assert one.part("optimizer-state").holders[0]["bytes"] == 200 * MiB and one.notes == []

    two = Split([PeakPart("optimizer-state", 200 * MiB, "", []), PeakPart("parameters", 100 * MiB, "", [])])
    peak._optimizers_named(two, agent([["SGD", 60 * MiB, 0, 20 * MiB], ["Adam", 40 * MiB, 0, 80 * MiB]]), 0)
    assert [(h["name"], h["bytes"]) for h in two.part("optimizer-state").holders] == \
        [("Adam.state", 80 * MiB), ("SGD.state", 20 * MiB)]
    assert two.notes == ["optimizer state: the optimizers' figures as the reading at 4.5 s found them "
                         "(100 MiB then)"]  # the parameters' 100 MiB agree: no note


def test_a_capture_s_line_is_written_after_its_reading(agent_and_clock, tmp_path):
    """A write to the run's file lets the program's threads run, and what they make meanwhile would
    count as the reading's: Neutral would spend its ballast on the program's objects and leave its
    count lower (seen on an H200: a capture on the agent's thread counted 39). The capture's line
    (a string: nothing the collector counts) is written once the reading is over. (A record that
    `write` makes of dicts, as the trace window's at a step, stays inside its reading, where its
    dicts are put back: on the program's thread only the agent's, which makes none, can run.)"""
    agent, clock = agent_and_clock
    neutral, channel = agent.sampler.neutral, agent.shared.channel
    inside, written_inside = [False], []
    read, write_line = neutral.read, channel.write_line

    def reading(fn, arg, room=False):
        inside[0] = True
        try:
            return read(fn, arg, room)
        finally:
            inside[0] = False

    def writing_line(text):
        written_inside.extend([text[:20]] if inside[0] else [])
        return write_line(text)

    neutral.read, channel.write_line = reading, writing_line
    for step in range(12):
        clock.now += 0.05
        agent.shared.torch.set((step + 1) * 256 * MiB, (step + 1) * 256 * MiB)
        agent.on_step(explicit=True)
        if step % 3 == 0:
            clock.now += 0.05
            agent.shared.torch.set((step + 2) * 256 * MiB, (step + 2) * 256 * MiB)
            agent.sampler.sample("time")  # as the agent's own thread samples
    assert len(captures(tmp_path, agent)) >= 6
    assert written_inside == []
