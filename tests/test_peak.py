"""What made the peak (issue 31): the agent's captures at new highs (_agent/peak.py) over the torch
test double, its probe of the program's names over real CPU tensors, and the composition the
diagnosis makes of them (diagnosis/peak.py). The allocator figures here are SYNTHETIC; the parts
measured on a GPU are checked in tests/gpu/test_scenarios.py against the programs' own sums."""
from __future__ import annotations

import threading
import time

import pytest

from gpumemdoctor._agent import peak as agent_peak
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
        agent.torch.set(level, level)
        agent.on_step(explicit=True)
    found = captures(tmp_path, agent)
    # 32 MiB is below MIN_BYTES; 520 MiB is within RISE of 512; 900 MiB and the repeat are no new highs.
    assert [c["reserved"] for c in found] == [512 * MiB, GiB, 2 * GiB]
    root = records.empty_root()
    for c in found:
        records.apply_record(root, "peak", c, 0.0)  # the declared shape reads them
    assert [c["n"] for c in root["peaks"]] == [1, 2, 3]
    assert agent.cost["peak_capture_max_s"] > 0


def test_captures_stop_at_their_bound_and_late_ones_need_a_larger_rise(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    level = 256 * MiB
    for _ in range(200):
        level = int(level * 1.03) + 17 * MiB  # a new high at every step, 3% up
        clock.now += 0.05
        agent.torch.set(level, level)
        agent.on_step(explicit=True)
    found = captures(tmp_path, agent)
    assert len(found) == agent_peak.MAX_CAPTURES
    late = found[agent_peak.LATE_CAPTURES:]
    assert all(b["reserved"] >= a["reserved"] * (1 + agent_peak.LATE_RISE) for a, b in zip(late, late[1:]))


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
    probe = agent_peak.Probe(torch, agent_peak_names(), time.perf_counter() + deadline_s, on_device=lambda t: True)
    return probe


def agent_peak_names():
    from gpumemdoctor._agent.graphs import SavedNames

    return SavedNames()


def test_the_probe_names_graphs_kept_by_a_running_sum_the_locals_and_the_modules():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))

    def evaluate():
        total = 0.0
        scratch = torch.empty(300_000)  # a local of a running function
        for _ in range(5):
            x = torch.randn(32, 256)
            total = total + model(x).square().mean()  # keeps each batch's graph
        probe = _probe(torch)
        return probe.run(), scratch, total

    found, scratch, _ = evaluate()
    assert found["stopped"] is None
    temporaries = {h[0]: h[1] for h in found["temporaries"]}
    assert temporaries["evaluate() local scratch"] == scratch.untyped_storage().nbytes()
    graphs = found["graphs-kept"]
    assert graphs and graphs[0][0] == "evaluate() local total.grad_fn"
    # Five batches: each saved its input (32x256) and the ReLU's output (32x1024), at least.
    assert found["graphs-kept_bytes"] >= 5 * (32 * 256 + 32 * 1024) * 4
    # The weights the graphs save are the model's parameters, counted there and not again.
    assert found["parameters_bytes"] == sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert found["graph_nodes"] > 5


def test_the_probe_stops_at_its_budget_and_says_so():
    torch = pytest.importorskip("torch")

    def evaluate():
        total = torch.zeros((), requires_grad=True)
        for _ in range(3000):
            total = total + torch.ones(4, requires_grad=True).sum()
        return _probe(torch, deadline_s=0.0005).run()

    found = evaluate()
    assert found["stopped"] == "time"


def test_the_probe_runs_on_the_main_thread_when_the_agent_s_thread_asks(agent_and_clock, tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("pending calls run on the main thread")
    agent, clock = agent_and_clock
    agent.torch.nn = type("nn", (), {"Module": type("Module", (), {})})
    clock.now += 1
    agent.torch.set(GiB, GiB)
    sampling = threading.Thread(target=agent.sampler._sample, args=("time", True), name="gpumemdoctor-agent")
    sampling.start()
    sampling.join()
    for _ in range(1000):  # the program's bytecodes: the pending call runs between two of them
        pass
    probes = [r for r in agent_records(tmp_path, agent) if r["type"] == "peak_probe"]
    assert len(probes) == 1 and probes[0]["n"] == 1 and "error" not in probes[0], probes
    root = records.empty_root()
    records.apply_record(root, "peak_probe", probes[0], 0.0)


# -- the composition (diagnosis/peak.py), from SYNTHETIC records ------------------------------------

class _Agent:
    def __init__(self, peaks, probes=(), libraries=()):
        self.pid = 7
        self.root = {"peaks": list(peaks), "peak_probes": list(probes), "libraries": list(libraries), "groups": []}

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


def test_probe_parts_fit_inside_the_allocated_memory_and_say_when_cut():
    probe = {"n": 2, "t": 5.01, "elapsed_s": 0.004, "stopped": None, "graph_nodes": 10,
             "graphs-kept": [["evaluate() local total.grad_fn", 2 * GiB, "eval.py:12"]], "graphs-kept_bytes": 2 * GiB,
             "temporaries": [["evaluate() local x", 10 * MiB, "eval.py:11"]], "temporaries_bytes": 10 * MiB}
    agent = _Agent([capture(2, paused=True)], [probe])
    c, found = peak.compose(agent, 0, breakdown(), "process 7 on GPU 0")
    got = {p.category: p.bytes for p in c.parts}
    assert got["graphs-kept"] == GiB and "temporaries" not in got and "unclassified" not in got
    assert any("cut to fit" in n for n in c.notes)
    kinds = {f.kind for f in found}
    assert kinds == {"state-at-evaluation", "avoidable-peak"}
    graphs = next(f for f in found if f.kind == "avoidable-peak")
    assert "evaluate() local total.grad_fn (eval.py:12)" in graphs.summary


def test_fragmentation_and_a_large_temporary_are_findings_small_ones_are_not():
    probe = {"n": 1, "t": 5.0, "elapsed_s": 0.001, "temporaries": [["prepare() local wide", GiB, "p.py:4"]],
             "temporaries_bytes": GiB}
    agent = _Agent([capture(1, parameters=0, gradients=0, optimizer_state=0, optimizers=[],
                            inactive_split=700 * MiB)], [probe])
    c, found = peak.compose(agent, 0, breakdown(), "process 7 on GPU 0")
    assert {f.kind for f in found} == {"fragmented-peak", "temporary-peak"}
    small = _Agent([capture(1, inactive_split=100 * MiB)])
    assert peak.compose(small, 0, breakdown(), "process 7 on GPU 0")[1] == []


def test_no_capture_no_composition_and_a_missing_context_is_said():
    assert peak.compose(_Agent([]), 0, breakdown(), "p") == (None, [])
    c, _ = peak.compose(_Agent([capture(nvml=None)]), 0, breakdown(context=None), "p")
    assert c.total_bytes == 4 * GiB and any("context was not read" in n for n in c.notes)


def test_the_allocated_peak_counter_above_the_reading_is_kept_and_drawn():
    from gpumemdoctor.reporters import terminal

    c, _ = peak.compose(_Agent([capture(allocated_peak=3 * GiB + 700 * MiB, inside="backward")]), 0, breakdown(), "p")
    assert c.allocated_peak_bytes == 3 * GiB + 700 * MiB
    assert "700 MiB above this moment" in terminal.allocated_peak_note(c)
    assert "inside backward()" in c.part("unclassified").how


def test_the_probe_walks_a_long_chain_to_its_end():
    torch = pytest.importorskip("torch")

    def evaluate():
        total = torch.zeros(())
        w = torch.ones(1000, requires_grad=True)
        for _ in range(300):
            total = total + (w * torch.full((1000,), 2.0)).sum()  # each product saves its 4000-byte operand
        return _probe(torch).run()

    found = evaluate()
    # Node wrappers are made as the walk reads them: without keeping them, a freed one's id comes
    # back for the next node, which the walk then takes for one it has seen and stops.
    assert found["graph_nodes"] >= 900, found["graph_nodes"]
    assert found["graphs-kept_bytes"] >= 300 * 4000
