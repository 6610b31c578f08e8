"""What the calls of one agent sample cost on this machine's GPU: medians of many calls.

    python benchmarks/sample_cost.py [--calls 2000]

A sample reads NVML's process list, PyTorch's allocator statistics, and NVML again
(gpumemdoctor/_agent/sampler.py). Which of them is dear depends on the host: one H100 host read
the statistics in about 150 us and NVML in 7 us, another the statistics in 20 us and NVML in 38 us
(NOTES.md). This times each call alone, then the agent's whole reading of the devices. Needs a
CUDA GPU, torch and nvidia-ml-py; says so and exits 0 without them.
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
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
    n = args.calls
    timed("torch.cuda.memory_stats_as_nested_dict(0)", lambda: torch.cuda.memory_stats_as_nested_dict(0), n)
    timed("torch._C._cuda_memoryStats(0)", lambda: torch._C._cuda_memoryStats(0), n)
    timed("torch.cuda.mem_get_info(0)", lambda: torch.cuda.mem_get_info(0), n)
    timed("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle), n)
    timed("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), n)
    sys.path.insert(0, ROOT)
    from gpumemdoctor._agent.core import Agent

    agent = Agent(None, 0.02)  # no run folder: it records nothing
    agent.begin()
    agent.on_cuda()
    time.sleep(0.2)
    timed("the agent's sampler.read_devices()", agent.sampler.read_devices, n // 2)
    # its own accounting (thread time) of the timer's samples meanwhile
    print("agent cost windows:", {k: round(v, 2) for k, v in agent.sampler.cost.windows().items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
