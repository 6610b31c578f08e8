"""The exit search's first sweep (gpumemdoctor/_agent/search/first_sweep.py, search.Finder.run_first) and
the exit's confirmation of the blocks it took for cuBLAS's workspaces (exit._confirm), on CPU
tensors: the search matches storages by address, so a CPU tensor is found as a CUDA one is."""
from __future__ import annotations

import gc
import json
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpumemdoctor._agent import exit as agent_exit  # noqa: E402
from gpumemdoctor._agent.search import first_sweep, search  # noqa: E402
from gpumemdoctor._agent.search.blocks import TensorKind, storage_span  # noqa: E402

KIND = TensorKind(torch)
MIB = 1 << 20
WORKSPACE = 32 * MIB


class Layer:
    def __init__(self, n, view=False):
        self.weight = torch.ones(n, requires_grad=True)
        self.weight.grad = torch.zeros(n)
        self.state = {"exp_avg": torch.zeros(n)}
        if view:
            self.state["view"] = self.state["exp_avg"][1:]  # a view: the same block


def block_of(tensor, device=0) -> dict:
    address, size = storage_span(tensor)
    return {"device": device, "address": address, "size": size, "frames": [], "new": True}


def blocks_of_model() -> list:
    out = []
    for layer in MODEL:
        out += [block_of(layer.weight), block_of(layer.weight.grad), block_of(layer.state["exp_avg"])]
    return out


def no_tensors(*sizes, device=0) -> list:
    """Blocks at addresses no tensor's storage lies in (far above any real one)."""
    return [{"device": device, "address": (1 << 60) + i * (1 << 32), "size": size, "frames": [], "new": True}
            for i, size in enumerate(sizes)]


def run(blocks: list, first: bool) -> dict:
    collecting = gc.isenabled()
    gc.disable()
    try:
        return search.investigate(torch, KIND, {"blocks": {}, "storages": set()}, 10.0,
                                  search.Roots({threading.get_ident()}), {}, all_live=True, blocks=blocks,
                                  first=first)
    finally:
        if collecting:
            gc.enable()


@pytest.fixture()
def model(monkeypatch):
    # Among a test session's modules the sweep may reach more objects than a program's exit does.
    monkeypatch.setattr(first_sweep, "MAX_OBJECTS", 10 ** 7)
    global MODEL
    MODEL = [Layer(64 + i) for i in range(6)]
    yield MODEL
    del MODEL


def test_the_first_sweep_places_every_block_as_the_full_search_does(model):
    blocks = blocks_of_model()
    full, first = run(blocks, first=False), run(blocks, first=True)
    assert json.dumps(first["groups"], sort_keys=True) == json.dumps(full["groups"], sort_keys=True)
    held = {h["pattern"]: h["count"] for g in first["groups"] for h in g["holders"]}
    assert held == {f"{__name__}.MODEL[*].weight": 6, f"{__name__}.MODEL[*].weight.grad": 6,
                    f"{__name__}.MODEL[*].state['exp_avg']": 6}
    assert first["complete"] is True and "workspaces" not in first
    assert "first_sweep_s" in first["phases"] and "anchors_s" not in first["phases"]  # no pass over the heap
    assert first["visited"] == first["phases"]["first_swept"] < full["visited"]  # the objects it reached
    assert first["tensors"] >= 12  # those it reached (a .grad is read through its leaf)


def test_of_two_tensors_in_one_block_the_first_reached_names_it(model):
    MODEL.append(Layer(300, view=True))
    result = run(blocks_of_model(), first=True)
    held = {h["pattern"]: h["count"] for g in result["groups"] for h in g["holders"]}
    assert held[f"{__name__}.MODEL[*].state['exp_avg']"] == 7  # before the view, in the dict's order
    assert not any("view" in p for p in held)


def test_blocks_of_a_workspaces_size_that_no_tensor_covers_are_taken_for_cublas_workspaces(model):
    blocks = blocks_of_model() + no_tensors(WORKSPACE, WORKSPACE, MIB)
    result = run(blocks, first=True)
    assert result["workspaces"] == [[0, 2 * WORKSPACE + MIB, 3]]
    assert result["complete"] is False  # not before the exit confirms them
    unheld = [w for g in result["groups"] for w in g["unheld_why"]]
    assert unheld == [["cublas-workspace", 2 * WORKSPACE + MIB, 3, None]]
    assert "anchors_s" not in result["phases"]


def test_any_other_block_left_open_makes_the_full_search(model):
    blocks = blocks_of_model() + no_tensors(WORKSPACE, 3 * MIB + 512)
    result = run(blocks, first=True)
    assert "workspaces" not in result and "anchors_s" in result["phases"]  # the heap pass was made
    assert "first_sweep_s" in result["phases"]  # after the first sweep had been tried
    unheld = [w for g in result["groups"] for w in g["unheld_why"]]
    assert unheld == [["no-python-object", WORKSPACE + 3 * MIB + 512, 2, None]]
    assert result["complete"] is True


def test_a_workspace_sized_tensor_held_only_by_a_dead_cycle_is_found_by_the_full_search_after_all(model):
    class Ring:
        pass

    collecting = gc.isenabled()
    gc.disable()  # the cycle must live through both searches
    try:
        a, b = Ring(), Ring()
        a.peer, b.peer, a.t = b, a, torch.ones(MIB // 4)  # 1 MiB: a cuBLASLt workspace's size
        blocks = blocks_of_model() + [block_of(a.t)]
        del a, b
        first = run(blocks, first=True)
        full = run(blocks, first=False)  # what the exit does when clearing the workspaces gives back less
    finally:
        if collecting:
            gc.enable()
    assert first["workspaces"] == [[0, MIB, 1]]  # taken on trust: the exit must confirm it
    unheld = [w for g in full["groups"] for w in g["unheld_why"]]
    assert unheld[0][0] == "unreachable" and full["complete"] is False
    gc.collect()


def test_a_sweep_cut_short_with_blocks_open_makes_the_full_search(model, monkeypatch):
    monkeypatch.setattr(first_sweep, "MAX_OBJECTS", 3)
    blocks = blocks_of_model()
    result = run(blocks, first=True)
    assert "anchors_s" in result["phases"] and result["complete"] is True
    assert {h["pattern"] for g in result["groups"] for h in g["holders"]} >= {f"{__name__}.MODEL[*].weight"}


def test_a_sweep_cut_short_with_only_workspace_sized_blocks_open_takes_them_for_workspaces(model, monkeypatch):
    blocks = blocks_of_model() + no_tensors(WORKSPACE)
    covered_at = run(blocks_of_model(), first=True)["visited"]  # the objects it takes to cover the model
    everything = run(blocks, first=True)["phases"]["first_swept"]  # a block it never covers: all it reaches
    assert everything > covered_at + 20
    monkeypatch.setattr(first_sweep, "MAX_OBJECTS", (covered_at + everything) // 2)
    result = run(blocks, first=True)
    assert result["phases"]["first_swept"] < everything  # cut short
    assert result["workspaces"] == [[0, WORKSPACE, 1]] and "anchors_s" not in result["phases"]


@pytest.mark.parametrize("env, sizes", [
    ({}, {32 * MIB, (4096 * 2 + 16 * 8) * 1024, MIB}),
    ({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, {128 * 1024, MIB}),
    ({"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "4096"},
     {(4096 * 2 + 16 * 8) * 1024, 4 * MIB}),
    ({"CUBLAS_WORKSPACE_CONFIG": "nonsense", "CUBLASLT_WORKSPACE_SIZE": "x"}, set()),
])
def test_the_workspace_sizes_follow_pytorchs_environment(env, sizes):
    assert first_sweep.workspace_sizes(env) == sizes


def test_too_many_or_odd_sized_open_blocks_are_not_workspaces():
    sizes = first_sweep.workspace_sizes({})
    blocks = no_tensors(WORKSPACE, MIB) + no_tensors(WORKSPACE, device=1)
    assert first_sweep.open_workspaces({0, 1, 2}, blocks, sizes) == {0: [WORKSPACE + MIB, 2], 1: [WORKSPACE, 1]}
    assert first_sweep.open_workspaces({0, 1}, no_tensors(WORKSPACE, 5 * MIB), sizes) is None
    many = no_tensors(*[MIB] * (first_sweep.MAX_WORKSPACES + 1))
    assert first_sweep.open_workspaces(set(range(len(many))), many, sizes) is None


# -- the exit's confirmation ------------------------------------------------------

class Channel:
    def __init__(self):
        self.records = []

    def write(self, rec):
        self.records.append(rec)


class Watch:
    """The agent's growth watch, as exit._confirm uses it: its full search is scripted."""

    def __init__(self, agent, full):
        self.agent, self.full, self.calls = agent, full, []

    def write_exit_search(self, result):
        self.agent.channel.write({"type": "investigation", **result})

    def search(self, when, budget=None, first=True):
        self.calls.append((when, budget, first))
        if self.full is not None:
            self.write_exit_search(self.full)
        return self.full


class Agent:
    def __init__(self, full=None):
        self.channel = Channel()
        self.growth_watch = Watch(self, full)


GUESS = {"complete": False, "workspaces": [[0, 2 * WORKSPACE + MIB, 3]], "groups": []}
HELD = {"type": "p", "phase": "gc", "t": 1.0, "collected": None, "d": [], "skipped": "why"}


def test_workspaces_confirmed_by_what_clearing_them_gave_back_write_the_search_and_the_skipped_collection():
    agent = Agent()
    agent_exit._confirm(agent.growth_watch, agent.channel.write, GUESS, HELD, [[0, 2 * WORKSPACE + MIB]], "live")
    assert [r["type"] for r in agent.channel.records] == ["investigation", "p"]
    assert agent.channel.records[0]["workspaces"] == GUESS["workspaces"] and agent.growth_watch.calls == []


@pytest.mark.parametrize("cleared", [[[0, 2 * WORKSPACE]], [[0, 2 * WORKSPACE + 2 * MIB]], None, [[1, 0]]])
def test_workspaces_not_confirmed_make_the_full_search_whose_completeness_alone_keeps_the_skip(cleared):
    complete = {"complete": True, "groups": []}
    agent = Agent(full=complete)
    agent_exit._confirm(agent.growth_watch, agent.channel.write, GUESS, HELD, cleared, "live")
    assert agent.growth_watch.calls == [("exit", "live", False)]
    assert [r["type"] for r in agent.channel.records] == ["investigation", "p"]
    assert "workspaces" not in agent.channel.records[0]  # the full search's record, not the first sweep's

    agent = Agent(full={"complete": False, "groups": []})
    agent_exit._confirm(agent.growth_watch, agent.channel.write, GUESS, HELD, cleared, None)
    kinds = [r["type"] for r in agent.channel.records]
    assert kinds == ["investigation", "error"]  # no `gc` probe: what garbage held is not known
    assert "skipped unproven" in agent.channel.records[1]["message"]


def test_a_held_collection_record_is_returned_not_written(monkeypatch):
    class Sampler:
        def read_devices(self):
            return [[0, 10, 10, 20, 10, 30]]

    class Cuda:
        calls: list = []

        def synchronize(self, index):
            self.calls.append(("sync", index))

        def empty_cache(self):
            self.calls.append("empty_cache")

    agent = Agent()
    agent.sampler = Sampler()
    fake = type("T", (), {"cuda": Cuda()})()
    monkeypatch.setattr(agent_exit.streams, "allocate_one", lambda torch, index: None)
    end = [[0, 10, 10, 20, 10, 30]]
    read, write = agent.sampler.read_devices, agent.channel.write
    held = agent_exit._probe(fake, end, lambda name: None, read, write, None, "a reason", hold=True)
    assert held["phase"] == "gc" and held["skipped"] == "a reason" and held["d"] == end
    assert [r["phase"] for r in agent.channel.records] == ["sync", "empty_cache"]
    agent.channel.records.clear()
    assert agent_exit._probe(fake, end, lambda name: None, read, write, None, "a reason") is None
    assert [r["phase"] for r in agent.channel.records] == ["gc", "sync", "empty_cache"]


def test_the_report_reads_and_words_blocks_taken_for_workspaces(model):
    from gpumemdoctor.diagnosis import remedies, suspects
    from gpumemdoctor.recording import records

    result = run(blocks_of_model() + no_tensors(WORKSPACE, WORKSPACE, MIB), first=True)
    root = records.empty_root()
    records.apply_record(root, "investigation", {"when": "exit", "step": None, "trace": False, **result,
                                                   "t": 5.0}, t0=0.0)
    assert root["investigations"][0]["workspaces"] == [[0, 2 * WORKSPACE + MIB, 3]]
    live, _ = suspects.live_suspects(root, 0)
    assert any("cuBLAS keeps as its workspaces" in s["summary"] for s in live), [s["summary"] for s in live]
    text = remedies.unheld_remedy([["cublas-workspace", WORKSPACE, 1, None]], live=True)
    assert "cuBLAS workspaces" in text and "exactly their bytes" in text


# -- on the GPU: recordings of two corpus workloads (tests/fixtures/first_sweep, see its README) ----

RECORDED = Path(__file__).parent / "fixtures" / "first_sweep"


def recorded(name: str) -> tuple[dict, dict, dict]:
    report = json.loads((RECORDED / f"{name}.json").read_text())
    (agent,) = [a for a in report["recording"]["agents"] if a["root"]["investigations"]]
    (exit_search,) = [i for i in agent["root"]["investigations"] if i["when"] == "exit"]
    return report, agent, exit_search


@pytest.mark.parametrize("name", ["timm_resnet50_ema", "hf_gpt2_kept_outputs"])
def test_on_the_gpu_the_first_sweep_placed_every_block_and_the_exit_confirmed_the_workspaces(name):
    report, agent, found = recorded(name)
    assert "first_sweep_s" in found["phases"] and "anchors_s" not in found["phases"]  # no pass over the heap
    assert found["visited"] == found["phases"]["first_swept"]
    # Two 32 MiB workspaces (the main thread's and autograd's) and cuBLASLt's 1 MiB, exactly what
    # clearing them gave back at exit; the collection the search let be skipped was written after.
    assert found["workspaces"] == [[0, 2 * WORKSPACE + MIB, 3]]
    assert agent["exit_info"]["parts"]["cublas_workspaces"] == [[0, 2 * WORKSPACE + MIB]]
    assert agent["errors"] == [] and agent["probes"]["gc"]["collected"] is None
    assert report["breakdown"][0]["garbage_bytes"] == 0


def test_the_recorded_resnet_names_its_workspaces_and_the_same_holders_as_before():
    report, _, found = recorded("timm_resnet50_ema")
    assert found["elapsed_s"] < found["budget_s"]
    (live,) = [f for f in report["findings"] if f["kind"] == "live-at-exit"]
    summaries = [s["summary"] for s in live["suspects"]]
    assert summaries[0].startswith("200 MiB in 322 allocations at timm_resnet50_ema.py:33 in <module>(); held by "
                                   "__main__.optimizer.state[<Parameter>]['exp_avg_sq']")
    assert summaries[-1] == "32.0 MiB that cuBLAS keeps as its workspaces"
    assert "clearing the workspaces at exit gave back exactly their bytes" in live["suspects"][-1]["remedy"]


def test_the_recorded_gpt2_leak_is_held_where_it_always_was():
    report, _, _ = recorded("hf_gpt2_kept_outputs")
    (leak,) = [f for f in report["findings"] if f["kind"] == "leak"]
    assert leak["suspects"][0]["holders"][0]["pattern"] == "__main__.history[*]['logits']"


def test_a_probe_that_fails_after_the_search_leaves_no_unconfirmed_workspaces(monkeypatch):
    """The search's record waits for the confirmation: where the probes fail before it, the full
    search is made and written instead, and no `gc` probe."""
    calls = []

    class Watch:
        suspected, baseline = True, None

        def __init__(self, agent):
            self.agent = agent

        def search(self, when, budget=None, started=None, hold=False, first=True):
            calls.append((when, hold, first))
            result = dict(GUESS) if first else {"complete": True, "groups": []}
            if not hold:
                self.write_exit_search(result)
            return result

        def write_exit_search(self, result):
            self.agent.channel.write({"type": "investigation", **result})

        def wait_for_copies(self):
            pass

    class Sampler:
        stats_fn = None

        def read_devices(self):
            return [[0, 10, 10, 20, 10, 30]]

    agent = Agent()
    agent.growth_watch, agent.sampler, agent.cost = Watch(agent), Sampler(), {}
    agent.peak_watch = agent.history = type("X", (), {"at_exit": lambda self: None})()
    agent.trace = type("Trace", (), {"mode": "auto"})()
    agent.run_dir = None

    def boom(*args, **kwargs):
        raise RuntimeError("a probe failed")

    monkeypatch.setattr(agent_exit.streams, "settle", lambda *a: None)
    monkeypatch.setattr(agent_exit.parts_of, "measure_at_end", lambda *a: {})
    monkeypatch.setattr(agent_exit, "_probe", boom)
    with pytest.raises(RuntimeError):
        agent_exit._exit_probes(torch, {}, sampler=agent.sampler, channel=agent.channel, watch=agent.growth_watch,
                                peak_watch=agent.peak_watch, history=agent.history, trace=agent.trace,
                                cost=agent.cost, snapshot_path=None)
    assert calls == [("exit", True, True), ("exit", False, False)]
    assert [r["type"] for r in agent.channel.records] == ["p", "investigation"]  # `end`, then the full search's
    assert "workspaces" not in agent.channel.records[1]
