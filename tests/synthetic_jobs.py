"""Synthetic recordings of distributed jobs, built in code for the tests: NOT measured on a GPU.

A job here is what `gpumemdoctor run -m torch.distributed.run --nproc-per-node N train.py` records
on one host: the launcher (an agent without a rank, never on a GPU) and N rank processes (agents
whose hello named RANK, LOCAL_RANK, WORLD_SIZE...), each working on the GPU of its local rank.
The figures follow what docs/verdicts.md and docs/gpu-facts.md describe (a context of about
500 MiB, a cache above the allocated memory), so the diagnosis sees the shapes it sees on a GPU;
the recordings of real 2-GPU runs, once committed to tests/fixtures/reports, are checked by the
same invariants (tests/test_ranks.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpumemdoctor.recording.recording import (AgentRecording, DeviceReading, Dist, ProcessRecord, Recording,
                                    TorchDevice, TorchSample)

MIB = 1 << 20
GIB = 1 << 30
CONTEXT = 500 * MIB
STEPS = 40


@dataclass
class Rank:
    """One rank process of a synthetic job."""

    rank: int
    local_rank: int | None = None  # default: the rank modulo the GPUs of the host
    base: int = 2 * GIB  # allocated at the first step
    leak_per_step: int = 0
    cache: int = 256 * MIB
    extra_peak: int = 0  # how far PyTorch's reserved peak went above the final reserved memory
    stray: int = 0  # bytes held on GPU 0 (its cuda:0) where PyTorch never reserved anything
    workers: list[int] = field(default_factory=list)  # pids of DataLoader workers with a context on its GPU


def gpu_devices(count: int) -> list[TorchDevice]:
    return [TorchDevice(index=i, uuid=f"GPU-{i:04d}", pci_bus_id=f"00000000:{i + 1:02x}:00.0",
                        name="Synthetic GPU", nvml_index=i) for i in range(count)]


def _reading(torch_index: int, allocated: int, cache: int, peak_extra: int = 0) -> DeviceReading:
    reserved = allocated + cache
    return DeviceReading(torch_index=torch_index, allocated_bytes=allocated, active_bytes=allocated,
                         reserved_bytes=reserved, requested_bytes=allocated, nvml_used_bytes=reserved + CONTEXT,
                         allocated_peak_bytes=allocated + peak_extra, reserved_peak_bytes=reserved + peak_extra)


def _stray_reading(torch_index: int, held: int) -> DeviceReading:
    return DeviceReading(torch_index=torch_index, allocated_bytes=0, active_bytes=0, reserved_bytes=0,
                         requested_bytes=0, nvml_used_bytes=held, allocated_peak_bytes=0, reserved_peak_bytes=0)


def rank_agent(r: Rank, pid: int, ppid: int, world_size: int, gpus: int, run_id: str = "job-1",
               node_rank: int = 0) -> tuple[AgentRecording, dict]:
    """The rank's agent, and its NVML series {(pid, NVML index): points}."""
    local = r.local_rank if r.local_rank is not None else r.rank % gpus
    samples, series = [], {(pid, local): [(0.9, CONTEXT)]}
    if r.stray:
        series[(pid, 0)] = [(0.5, r.stray)]
    for step in range(1, STEPS + 1):
        t = 1.0 + 0.1 * step
        readings = [_reading(local, r.base + r.leak_per_step * step, r.cache, r.extra_peak)]
        if r.stray and local != 0:
            readings.insert(0, _stray_reading(0, r.stray))
        samples.append(TorchSample(t=t, by="step", step=step, readings=readings))
        series[(pid, local)].append((t, readings[-1].nvml_used_bytes))
    end = [_reading(local, r.base + r.leak_per_step * STEPS, r.cache, r.extra_peak)]
    if r.stray and local != 0:
        end.insert(0, _stray_reading(0, r.stray))
    emptied = [_reading(local, r.base + r.leak_per_step * STEPS, 0, r.extra_peak)]
    probes = {phase: TorchSample(t=5.2 + 0.1 * i, by=phase, step=None, readings=emptied if phase == "empty_cache" else end,
                                 collected=3 if phase == "gc" else None)
              for i, phase in enumerate(("end", "gc", "sync", "empty_cache"))}
    for key in series:
        series[key].append((5.7, 0))
    agent = AgentRecording(
        pid=pid, ppid=ppid, argv=["train.py"], python="3.12.3", torch_version="2.11.0", cuda_t=0.5,
        allocator_backend="native", devices=gpu_devices(gpus), samples=samples, probes=probes, steps=STEPS,
        exited_normally=True,
        dist=Dist(rank=r.rank, local_rank=local, world_size=world_size, local_world_size=gpus,
                  node_rank=node_rank, run_id=run_id, source="torch"))
    return agent, series


def worker_agent(pid: int, rank_agent_: AgentRecording, gpu: int) -> tuple[AgentRecording, dict]:
    """A DataLoader worker of a rank that touched CUDA on the rank's GPU: a context, nothing reserved."""
    samples = [TorchSample(t=1.0 + 0.5 * i, by="time", step=None, readings=[_stray_reading(gpu, CONTEXT)])
               for i in range(4)]
    agent = AgentRecording(
        pid=pid, ppid=rank_agent_.pid, argv=["train.py"], python="3.12.3", torch_version="2.11.0", cuda_t=0.8,
        devices=rank_agent_.devices, samples=samples, exited_normally=True, dist=rank_agent_.dist,
        cuda_origin={"thread": "MainThread", "stack": [["/job/train.py", 30, "worker_init"]],
                     "dataloader_worker": {"id": pid % 4, "num_workers": 4}, "multiprocessing_child": True})
    return agent, {(pid, gpu): [(0.8, CONTEXT), (3.0, CONTEXT), (5.5, 0)]}


def job(ranks: list[Rank], *, gpus: int = 2, host: str | None = "node-a", world_size: int | None = None,
        launcher_pid: int = 1000, first_pid: int = 1001, run_id: str = "job-1", node_rank: int = 0,
        started_wall: float = 1_700_000_000.0) -> Recording:
    """One host's recording of a torchrun job with these ranks."""
    world = world_size if world_size is not None else len(ranks)
    launcher = AgentRecording(pid=launcher_pid, ppid=1, argv=["-m", "torch.distributed.run"], python="3.12.3",
                              exited_normally=True)
    agents, nvml = [launcher], {}
    processes = [ProcessRecord(pid=launcher_pid, ppid=1, cmdline=["python", "-m", "torch.distributed.run"],
                               create_time=1.0e9, is_target=True, first_seen_t=0.0)]
    pid = first_pid
    for r in ranks:
        agent, series = rank_agent(r, pid, launcher_pid, world, gpus, run_id, node_rank)
        agents.append(agent)
        nvml.update(series)
        processes.append(ProcessRecord(pid=pid, ppid=launcher_pid, cmdline=["python", "train.py"],
                                       create_time=1.0e9 + 1, is_target=False, first_seen_t=0.4))
        for worker in r.workers:
            w, w_series = worker_agent(worker, agent, agent.dist.local_rank)
            agents.append(w)
            nvml.update(w_series)
            processes.append(ProcessRecord(pid=worker, ppid=pid, cmdline=["python", "-c", "worker"],
                                           create_time=1.0e9 + 2, is_target=False, first_seen_t=0.7))
        pid += 1
    return Recording(
        tool_version="0.1.0",
        target={"argv": ["-m", "torch.distributed.run", "--nproc-per-node", str(len(ranks)), "train.py"],
                "pid": launcher_pid, "exit_code": 0, "signal": None, "cwd": "/job"},
        started_wall=started_wall, duration_s=5.8, poll_interval_s=0.005, nvml_available=True,
        versions={"tool": "0.1.0", "python": "3.12.3", "torch": "2.11.0"},
        devices=[{"index": i, "uuid": f"GPU-{i:04d}", "pci_bus_id": f"00000000:{i + 1:02x}:00.0",
                  "name": "Synthetic GPU", "total_bytes": 80 * GIB} for i in range(gpus)],
        nvml=nvml, processes=processes, agents=agents, host=host)
