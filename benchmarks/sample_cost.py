"""What the calls of one agent sample cost on this machine's GPU: medians of many calls.

    python benchmarks/sample_cost.py [--calls 2000] [--busy]

A sample reads NVML's process list, PyTorch's allocator statistics, and the process list again
(gpumemdoctor/_agent/readings/sampler.py). Which call is dear depends on the host and on the process: alone
in an idle process one H100 host read the statistics in about 150 us and the process list in 7 us,
another in 20 us and 38 us (NOTES.md). This times each call alone, then the agent's whole reading
of the devices.

--busy times them as a sample meets them: in a process that trains a tiny MLP (the short loop
of overhead.py), each call made after five steps are queued, wall time and the thread's CPU time.
Needs a CUDA GPU, torch and nvidia-ml-py; says so and exits 0 without them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(name: str, fn, calls: int) -> None:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    print(f"{name:45s} median {statistics.median(times) * 1e6:8.1f} us  p90 {times[int(calls * 0.9)] * 1e6:8.1f} us")


def timed_cpu(name: str, fn, calls: int, between) -> None:
    """Wall and thread-CPU time of fn(), each call after between() (the loop's steps)."""
    wall, cpu = [], []
    for _ in range(calls):
        between()
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        wall.append((w1 - w0) / 1e3)
        cpu.append((c1 - c0) / 1e3)
    wall.sort()
    cpu.sort()
    print(f"{name:45s} wall median {statistics.median(wall):7.1f} us p90 {wall[int(calls * 0.9)]:7.1f} us"
          f" | cpu median {statistics.median(cpu):7.1f} us p90 {cpu[int(calls * 0.9)]:7.1f} us", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--busy", action="store_true", help="time the calls between the steps of a training loop")
    args = p.parse_args(argv)
    try:
        import pynvml
        import torch
    except ImportError as exc:
        print(f"sample_cost: skipped: {exc}")
        return 0
    if not torch.cuda.is_available():
        print("sample_cost: skipped: no CUDA GPU for torch here")
        return 0
    torch.empty(1 << 20, device="cuda")  # the context, complete
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    sys.path.insert(0, ROOT)
    from gpumemdoctor._agent.core import Agent

    agent = Agent(None, 0.02)  # no run folder: it records nothing
    agent.begin()
    agent.on_cuda()
    time.sleep(0.2)
    agent.timer.stop()  # its own samples would land among the timed calls
    sampler = agent.sampler
    n = args.calls
    if not args.busy:
        timed("torch.cuda.memory_stats_as_nested_dict(0)", lambda: torch.cuda.memory_stats_as_nested_dict(0), n)
        timed("torch._C._cuda_memoryStats(0)", lambda: torch._C._cuda_memoryStats(0), n)
        timed("torch.cuda.mem_get_info(0)", lambda: torch.cuda.mem_get_info(0), n)
        timed("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle), n)
        timed("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), n)
        timed("the agent's sampler.read_devices()", sampler.read_devices, n // 2)
        return 0

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")

    def five_steps() -> None:
        for _ in range(5):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(60):
        five_steps()
    torch.cuda.synchronize()
    n = min(n, 500)
    print(f"between the steps of a training loop, {n} calls each:")
    timed_cpu("torch._C._cuda_memoryStats(0)", lambda: torch._C._cuda_memoryStats(0), n, five_steps)
    timed_cpu("process list (nvml.ProcessMemory.used)", sampler.nvml_readers[0].used, n, five_steps)
    timed_cpu("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), n, five_steps)
    timed_cpu("the agent's sampler.read_devices()", sampler.read_devices, n, five_steps)
    timed_cpu("one whole sample (sampler._sample)", lambda: sampler._sample("step", True), n, five_steps)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
