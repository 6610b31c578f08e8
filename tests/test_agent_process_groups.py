"""The agent's look at torch.distributed's process groups (gpumemdoctor/_agent/readings/process_groups.py): a
record when their number changes, with what sizes NCCL's memory, and at exit what NCCL's
communicators hold. Real torch.distributed (gloo, one rank, on the CPU) under the torch test double's
agent (tests/doubles/fake_cuda.py); NCCL's own figures are SYNTHETIC (a stand-in backend)."""
from __future__ import annotations

import gc
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpumemdoctor._agent.readings import process_groups

_spec = importlib.util.spec_from_file_location("fake_cuda", Path(__file__).parent / "doubles" / "fake_cuda.py")
fake_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_cuda)

MiB = 1 << 20
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (a CPU build will do)")


@pytest.fixture
def agent_and_clock(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path), context_bytes=520 * MiB)


def groups_records(tmp_path, agent) -> list[dict]:
    lines = (tmp_path / f"agent-{agent.shared.pid}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "groups"]


def test_only_nccls_sizing_variables_are_kept():
    env = {"NCCL_BUFFSIZE": "1048576", "NCCL_MAX_NCHANNELS": "4", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO",
           "NCCL_SOCKET_IFNAME": "eth0", "NCCL_P2P_LEVEL": "NVL", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "NCCL_PROTO": "x" * 500, "PATH": "/bin"}
    kept = process_groups.sizing_env(env)
    assert list(kept) == ["NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS", "NCCL_NVLS_ENABLE", "NCCL_P2P_LEVEL", "NCCL_PROTO"]
    assert kept["NCCL_PROTO"] == "x" * process_groups.MAX_VALUE_CHARS
    many = {f"NCCL_BUFFSIZE_{i:03d}": "1" for i in range(100)}
    assert len(process_groups.sizing_env(many)) == process_groups.MAX_VARIABLES


def test_nccls_version_from_pytorchs_number():
    torch = SimpleNamespace(_C=SimpleNamespace(_nccl_version=lambda: (2 << 32) | (27 << 16) | 5))
    assert process_groups.nccl_version(torch) == "2.27.5"
    assert process_groups.nccl_version(SimpleNamespace(_C=SimpleNamespace())) is None  # a CPU build


@needs_torch
def test_a_record_when_the_groups_change_and_none_between(agent_and_clock, tmp_path, monkeypatch):
    import torch.distributed as dist

    agent, clock = agent_and_clock
    monkeypatch.setenv("NCCL_BUFFSIZE", "2097152")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    agent.shared.channel.write({"type": "hello", "pid": agent.shared.pid})  # what Agent.begin writes first
    agent.shared.torch.set(40 * MiB, 64 * MiB)
    agent.on_step(explicit=True)  # torch.distributed imported, no group yet: nothing to say
    assert groups_records(tmp_path, agent) == []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for _ in range(3):
            clock.now += 0.05
            agent.on_step(explicit=True)
        dist.new_group([0])
        clock.now += 0.05
        agent.on_step(explicit=True)
    finally:
        dist.destroy_process_group()
    clock.now += 0.05
    agent.on_step(explicit=True)
    first, second, gone = groups_records(tmp_path, agent)
    assert (first["groups"], first["backends"], first["step"]) == (1, ["gloo"], 2)
    assert first["world_size"] == 1 and first["nccl_version"] is None  # the test double has no NCCL
    assert first["nccl_env"] == {"NCCL_BUFFSIZE": "2097152"}
    assert (second["groups"], second["step"]) == (2, 5) and "nccl_env" not in second
    assert (gone["groups"], gone["backends"], gone["step"]) == (0, [], 6)
    assert first["t"] < second["t"] < gone["t"]
    # read back strictly, into the process's records, times from the run's start
    from gpumemdoctor.recording.agent_files import read_agent_file

    back = read_agent_file(str(tmp_path / f"agent-{agent.shared.pid}.jsonl"), 1000.0).root["groups"]
    assert [(r["groups"], r["step"], r["nccl_env"]) for r in back] == [(1, 2, {"NCCL_BUFFSIZE": "2097152"}),
                                                                       (2, 5, None), (0, 6, None)]
    assert back[0]["t"] == pytest.approx(first["t"] - 1000.0)


class _OnlyLen(dict):
    """torch.distributed's map of groups, where anything but its length fails the test: the check at
    each sample must look at nothing else while the count stays (it runs on the sampling path)."""

    def _refuse(self, *args, **kwargs):
        raise AssertionError("the check looked into the groups although their number did not change")

    items = values = keys = __iter__ = __getitem__ = get = _refuse


def test_an_unchanged_count_is_one_len(agent_and_clock, monkeypatch):
    agent, _ = agent_and_clock
    groups = _OnlyLen()
    dict.__setitem__(groups, object(), ("gloo", None))
    monkeypatch.setitem(sys.modules, "torch.distributed.distributed_c10d", SimpleNamespace(_pg_map=groups))
    watch = agent.process_groups
    watch.live = 1  # as the check left it at the sample that saw this group come
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(100):
            watch.check(2.0)
        assert gc.get_count()[0] == before
    finally:
        gc.enable()
    assert watch.records == 0
    dict.__setitem__(groups, object(), ("gloo", None))  # a new group: now it looks, and fails here
    with pytest.raises(AssertionError, match="looked into the groups"):
        process_groups.backends(groups)


def test_the_agent_never_imports_torch_distributed(agent_and_clock, monkeypatch):
    agent, _ = agent_and_clock
    for name in ("torch.distributed", "torch.distributed.distributed_c10d"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    agent.process_groups.check(1.0)
    assert process_groups.exit_memory(agent.shared.torch) is None
    assert "torch.distributed.distributed_c10d" not in sys.modules


class _Backend:
    def __init__(self, total):
        self.total = total

    def memory_stats(self):
        if isinstance(self.total, Exception):
            raise self.total
        return {"suspend": 0, "suspended": 0, "persist": self.total, "total": self.total}


class _Group:
    def __init__(self, total):
        self.backend = _Backend(total)

    def _get_backend(self, device):
        return self.backend


def test_at_exit_the_nccl_communicators_memory_is_what_they_say(monkeypatch):
    torch = SimpleNamespace(device=lambda kind: kind)
    c10d = SimpleNamespace(_pg_map={_Group(96 * MiB): ("nccl", None), _Group(32 * MiB): ("cpu:gloo,cuda:nccl", None),
                                    _Group(RuntimeError("gloo has none")): ("gloo", None)})
    monkeypatch.setitem(sys.modules, "torch.distributed.distributed_c10d", c10d)
    assert process_groups.exit_memory(torch) == {"groups": 3, "nccl_bytes": 128 * MiB}
    # an NCCL before 2.29.7 (or a PyTorch before 2.12) cannot say: not known, not 0
    c10d._pg_map = {_Group(RuntimeError("getMemoryStats() requires NCCL 2.29.7 or later")): ("nccl", None)}
    assert process_groups.exit_memory(torch) == {"groups": 1, "nccl_bytes": None}


# -- the context read before NCCL's eager set-up (issue 42) -------------------------------------

class _Cuda:
    def __init__(self, started: bool, current: int = 0, reserved: int = 0):
        self.started, self.current, self.reserved = started, current, reserved

    def is_initialized(self):
        return self.started

    def current_device(self):
        self.started = True  # as PyTorch's does: it starts CUDA
        return self.current

    def memory_reserved(self, index):
        return self.reserved


def _wrapped(monkeypatch, cuda: _Cuda, pid: int | None = None):
    """init_process_group of a stand-in torch.distributed, wrapped; (the wrapper, the records
    written, the calls the original got, the allocations the agent made)."""
    import os

    calls, written, made = [], [], []

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                           group_name="", pg_options=None, device_id=None):
        """The original."""
        calls.append((backend, device_id))
        return "returned"

    c10d = SimpleNamespace(init_process_group=init_process_group)
    dist = SimpleNamespace(init_process_group=init_process_group)
    monkeypatch.setitem(sys.modules, "torch.distributed.distributed_c10d", c10d)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    sampler = SimpleNamespace(neutral=object(), lock=__import__("threading").Lock(),
                              read_devices=lambda: [[0, 0, 0, 2 << 20, 0, 520 << 20, 0, 0]])
    shared = SimpleNamespace(pid=pid or os.getpid(), finished=False, devices=[{"index": 0}],
                             channel=SimpleNamespace(write=written.append))
    torch = SimpleNamespace(cuda=cuda, empty=lambda *a, **k: made.append(k.get("device")))
    process_groups.install_context_reading(shared, sampler, torch)
    assert c10d.init_process_group is dist.init_process_group is not init_process_group
    return c10d.init_process_group, written, calls, made


def test_with_device_id_the_context_is_read_on_that_device_before_the_call(monkeypatch):
    wrapper, written, calls, made = _wrapped(monkeypatch, _Cuda(started=True))
    assert wrapper("nccl", device_id=SimpleNamespace(type="cuda", index=0)) == "returned"
    assert wrapper.__name__ == "init_process_group" and wrapper.__doc__ == "The original."
    assert calls == [("nccl", calls[0][1])] and made == ["cuda:0"]
    (record,) = written
    assert (record["device"], record["nvml"], record["reserved"]) == (0, 520 << 20, 2 << 20)


@pytest.mark.parametrize("case", ["gloo", "cuda not started", "another device", "forked child"])
def test_no_reading_where_it_could_change_the_program(monkeypatch, case):
    cuda = _Cuda(started=case != "cuda not started", current=1 if case == "another device" else 0)
    wrapper, written, calls, made = _wrapped(monkeypatch, cuda, pid=1 if case == "forked child" else None)
    wrapper("gloo" if case == "gloo" else "nccl", device_id=SimpleNamespace(type="cuda", index=0))
    assert len(calls) == 1 and made == [] and written == []
    assert cuda.started is (case != "cuda not started")  # the agent never starts CUDA itself


def test_without_device_id_a_record_says_nccl_comes_later(monkeypatch):
    wrapper, written, calls, made = _wrapped(monkeypatch, _Cuda(started=False))
    wrapper("nccl")
    assert [r["device"] for r in written] == [-1] and made == []
