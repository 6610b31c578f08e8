"""The exit probes' parts (gpumemdoctor/_agent/readings/parts.py) on the torch test double
(tests/doubles/fake_cuda.py): cuBLAS workspaces, CUDA graphs' private pools, NCCL, CUDA's module
loading, and the exit record that carries them read back into a breakdown. The figures are
SYNTHETIC (set by the test); what is checked is what the agent reads, writes and leaves alone."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

_spec = importlib.util.spec_from_file_location("fake_cuda", Path(__file__).parent / "doubles" / "fake_cuda.py")
fake_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_cuda)

from gpumemdoctor._agent import exit as exit_probes  # noqa: E402
from gpumemdoctor._agent.readings import parts  # noqa: E402
from gpumemdoctor.recording.agent_files import read_agent_file  # noqa: E402
from gpumemdoctor.diagnosis.diagnose import diagnose  # noqa: E402
from gpumemdoctor.recording.recording import AgentRecording, Recording  # noqa: E402

MiB = 1 << 20
CONTEXT = 520 * MiB


@pytest.fixture
def agent_and_clock(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path), context_bytes=CONTEXT)


def records(tmp_path, agent) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / f"agent-{agent.shared.pid}.jsonl").read_text().splitlines()]


def stats_of(torch):
    return torch.cuda.memory_stats_as_nested_dict


def test_cublas_workspaces_are_what_clearing_them_frees():
    torch = fake_cuda.FakeTorch()
    torch.set(48 * MiB, 64 * MiB)
    torch.workspace_bytes = 32 * MiB
    assert parts.cublas_workspaces(torch, stats_of(torch), [0]) == [[0, 32 * MiB]]
    assert torch.allocated == 16 * MiB and torch._C.cleared == 1


def test_cublas_workspaces_are_not_known_without_the_function():
    torch = fake_cuda.FakeTorch()
    del torch._C
    assert parts.cublas_workspaces(torch, stats_of(torch), [0]) is None


def test_private_pools_come_from_pytorchs_statistic():
    torch = fake_cuda.FakeTorch()
    torch.private_pools = {(1, 0): 96 * MiB, (2, 0): 32 * MiB}
    assert parts.private_pools(torch, stats_of(torch), [0]) == [[0, 128 * MiB]]
    assert torch.cuda.memory.snapshots == 0  # the statistic is enough: no snapshot


def test_without_the_statistic_no_snapshot_is_taken_unless_a_graph_was_captured():
    torch = fake_cuda.FakeTorch()
    torch.private_pools = None  # a PyTorch without reserved_bytes_by_private_pools
    torch.cuda.memory.snapshot_segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 20 * MiB},
        {"device": 0, "segment_pool_id": (1, 0), "total_size": 64 * MiB},
        {"device": 1, "segment_pool_id": (1, 0), "total_size": 8 * MiB}]
    assert parts.private_pools(torch, stats_of(torch), [0]) == [[0, 0]]
    assert torch.cuda.memory.snapshots == 0
    torch.cuda.graphs.graph.default_capture_stream = object()  # torch.cuda.graph was used
    assert parts.private_pools(torch, stats_of(torch), [0]) == [[0, 64 * MiB]]
    assert torch.cuda.memory.snapshots == 1


def test_nccl_is_read_only_from_a_torch_distributed_the_program_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert parts.dist_backend() is None
    assert "torch.distributed" not in sys.modules  # never imported by the agent
    dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_backend=lambda: "nccl")
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    assert parts.dist_backend() == "nccl"
    dist.is_initialized = lambda: False  # destroyed before exit: its buffers are gone
    assert parts.dist_backend() is None


def test_exit_record_carries_the_parts_and_the_probes_stay_as_they_were(agent_and_clock, tmp_path, monkeypatch):
    agent, clock = agent_and_clock
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    monkeypatch.delitem(sys.modules, "torch.distributed.distributed_c10d", raising=False)  # a program without it
    agent.shared.channel.write({"type": "hello", "pid": agent.shared.pid})  # what Agent.begin writes first
    torch = agent.shared.torch
    for step in range(30):
        clock.now += 0.05
        torch.set(40 * MiB, 64 * MiB)
        agent.on_step(explicit=True)
    torch.workspace_bytes = 32 * MiB  # of the 40 MiB allocated
    torch.private_pools = {(1, 0): 16 * MiB}
    exit_probes.finish(agent)
    found = records(tmp_path, agent)
    (done,) = [r for r in found if r["type"] == "exit"]
    assert done["parts"] == {"private_pools": [[0, 16 * MiB]], "dist_backend": None, "module_loading": "LAZY",
                             "cublas_workspaces": [[0, 32 * MiB]], "process_groups": None,
                             "memory_fraction": None, "graph_pools": []}
    probes = {r["phase"]: r["d"][0] for r in found if r["type"] == "p"}
    # every probe read the workspaces as allocated: they are cleared only after the last reading
    assert [probes[p][1] for p in ("end", "gc", "sync", "empty_cache")] == [40 * MiB] * 4
    assert "exit_cublas_s" in done["cost"] and "exit_parts_s" in done["cost"]

    # read back strictly, kept in the recording, and itemised in the breakdown
    agent_rec = read_agent_file(str(tmp_path / f"agent-{agent.shared.pid}.jsonl"), 0.0)
    assert agent_rec.exit_info["parts"]["cublas_workspaces"] == [[0, 32 * MiB]]
    again = AgentRecording.from_json(json.loads(json.dumps(agent_rec.to_json())))
    assert again.exit_info == agent_rec.exit_info
    b = diagnose(_recording(again)).breakdowns[0]
    assert b.cublas_workspace_bytes == 32 * MiB and b.live_tensor_bytes == 40 * MiB
    assert b.private_pool_bytes == 16 * MiB and b.nccl is False and b.cuda_module_loading == "LAZY"


def test_a_failing_part_is_null_and_the_exit_record_is_still_written(agent_and_clock, tmp_path):
    agent, _ = agent_and_clock

    def broken():
        raise RuntimeError("CUDA error")

    agent.shared.torch._C._cuda_clearCublasWorkspaces = broken
    agent.shared.torch.set(8 * MiB, 20 * MiB)
    exit_probes.finish(agent)
    (done,) = [r for r in records(tmp_path, agent) if r["type"] == "exit"]
    assert done["parts"]["cublas_workspaces"] is None
    assert done["parts"]["private_pools"] == [[0, 0]]


def test_a_part_that_is_no_size_is_refused():
    from gpumemdoctor.errors import BadReportError
    from gpumemdoctor.recording.records import EXIT_INFO

    with pytest.raises(BadReportError, match="size in bytes"):
        EXIT_INFO({"parts": {"cublas_workspaces": [[0, -1]]}}, "exit")


def test_an_exit_record_from_before_the_parts_still_loads():
    old = {"pid": 7, "exit_info": {"uncaught": None, "samples": 3, "samples_skipped": 0, "collections": None,
                                   "out_of_memory": 0, "cost": {"init_s": 0.1}},
           "cupy_pool": {"used_bytes": 0, "total_bytes": 64 * MiB}}
    agent = AgentRecording.from_json(old)
    assert agent.exit_info["parts"] is None and agent.cupy_pool["total_bytes"] == 64 * MiB


def _recording(agent: AgentRecording) -> Recording:
    nvml = {(agent.pid, 0): [(s.t, s.readings[0].nvml_used_bytes) for s in agent.samples]}
    return Recording(tool_version="test", target={"pid": agent.pid, "argv": []}, started_wall=0.0,
                     duration_s=10.0, poll_interval_s=0.005, nvml_available=True, nvml=nvml, agents=[agent])


def test_a_sample_reads_pytorchs_stats_once_when_nothing_moves(agent_and_clock):
    agent, _ = agent_and_clock
    sampler = agent.sampler
    agent.shared.torch.set(100 * MiB, 128 * MiB)
    calls = []
    real = sampler.stats_fn
    sampler.stats_fn = lambda index: calls.append(index) or real(index)
    (row,) = sampler.read_devices()
    assert len(calls) == 1  # the costly read (about 150 us on an H100 host) once; NVML twice
    assert row[3] == 128 * MiB and row[5] == 128 * MiB + CONTEXT


def test_a_sample_is_read_again_when_the_allocator_reserved_between_its_reads(agent_and_clock):
    """The program reserves memory on another thread right after PyTorch's figures were read:
    NVML's second figure differs from its first, so the pair would not describe one moment."""
    agent, _ = agent_and_clock
    sampler = agent.sampler
    torch = agent.shared.torch
    torch.set(100 * MiB, 128 * MiB)
    calls = []
    real = sampler.stats_fn

    def reserve_after_the_first_read(index):
        stats = real(index)
        calls.append(index)
        if len(calls) == 1:
            torch.set(200 * MiB, 256 * MiB)  # after the figures were taken, before NVML's second read
        return stats

    sampler.stats_fn = reserve_after_the_first_read
    (row,) = sampler.read_devices()
    assert len(calls) == 2
    assert row[1] == 200 * MiB and row[3] == 256 * MiB and row[5] == 256 * MiB + CONTEXT


def test_the_exit_probes_allocate_only_where_the_program_reserved_memory(agent_and_clock):
    """Issue 29: rank 1's stray context on GPU 0 (NVML's memory, nothing reserved) got a synchronize
    and a one-element tensor from the exit probes, which then read PyTorch's 2 MiB there."""
    agent, _ = agent_and_clock
    torch = agent.shared.torch
    torch.set(40 * MiB, 64 * MiB)
    touched = []
    torch.cuda.synchronize = lambda index=None: touched.append(("synchronize", index))
    torch.empty = lambda *size, device=None: touched.append(("empty", device))
    # [torch index, allocated, active, reserved, requested, NVML, allocated peak, reserved peak]
    stray = [0, 0, 0, 0, 0, 600 * MiB, 0, 0]
    worked = [1, 40 * MiB, 40 * MiB, 64 * MiB, 40 * MiB, 64 * MiB + CONTEXT, 48 * MiB, 64 * MiB]
    emptied = [2, 0, 0, 0, 0, CONTEXT, 8 * MiB, 16 * MiB]  # used, then given back before exit
    assert exit_probes.program_devices([stray, worked, emptied]) == [1, 2]
    exit_probes._probe(torch, [stray, worked, emptied], lambda name: None, agent.sampler.read_devices,
                       agent.shared.channel.write, None, skip_gc="a test")
    assert touched == [("synchronize", 1), ("empty", "cuda:1"), ("synchronize", 2), ("empty", "cuda:2")]


@pytest.mark.parametrize("allocated, library, collected", [
    (0, None, False),  # nothing can be garbage: no collection (0.38 s at the end of a Lightning run)
    (8 * MiB, None, True),  # a tensor that a cycle could hold
    (0, "cupy", True),  # CuPy's arrays in a cycle hold memory PyTorch does not count
    (None, None, True),  # PyTorch's figure could not be read: nothing says that no tensor is allocated
])
def test_the_exit_collection_is_skipped_only_where_no_garbage_can_hold_gpu_memory(
        agent_and_clock, tmp_path, monkeypatch, allocated, library, collected):
    agent, _ = agent_and_clock
    agent.shared.torch.set(allocated or 0, 20 * MiB)
    if allocated is None:
        read = agent.sampler.read_devices
        monkeypatch.setattr(agent.sampler, "read_devices", lambda: [[r[0], None, *r[2:]] for r in read()])
    for name in exit_probes.KNOWN:
        monkeypatch.delitem(sys.modules, name, raising=False)
    if library:
        monkeypatch.setitem(sys.modules, library, SimpleNamespace())
    calls = []
    monkeypatch.setattr(exit_probes, "_collect_garbage", lambda torch, trace, kind, write: calls.append(1) or 0)
    agent.at_exit()
    (probe,) = [r for r in records(tmp_path, agent) if r.get("type") == "p" and r["phase"] == "gc"]
    assert bool(calls) is collected
    assert (probe.get("skipped") is None) is collected
    if not collected:
        assert probe["skipped"] == "no tensor was allocated at exit and no other GPU library was imported"


def test_an_interrupt_during_the_exit_probes_ends_them_quietly(agent_and_clock):
    """A second Ctrl-C while the program ends (issue 28, row 10) stops the probes; it is not raised
    into the interpreter's exit, which would print "Exception ignored in atexit callback"."""
    agent, _ = agent_and_clock
    agent.shared.torch.set(8 * MiB, 20 * MiB)

    def interrupted(record):
        raise KeyboardInterrupt

    agent.shared.channel.write = interrupted
    try:
        agent.at_exit()
    except KeyboardInterrupt:  # caught here, or it would stop the test session
        pytest.fail("the interrupt came out of Agent.at_exit")
    assert agent.shared.finished
