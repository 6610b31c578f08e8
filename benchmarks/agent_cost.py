"""What the agent costs the program it runs in, call by call, measured inside one process.

    python benchmarks/agent_cost.py [--interval 0.02]

End-to-end slowdowns of a short-step loop are within the run-to-run noise of
the loop itself (see overhead.py), so this measures the agent's own work
directly, in a CUDA process, with the agent's real code:
  - the optimizer step hook when no sample is due (every step pays this),
  - one sample (allocator statistics read once, the process's NVML figure twice,
    one JSON line written), paid once per sampling interval,
  - a real tiny optimizer.step() with and without the hook registered,
    interleaved blocks, medians.
From these it predicts the slowdown of a loop of a given step time. Needs a GPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from _loop import cuda_torch_here


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over repeats of the mean time of one call, in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interval", type=float, default=0.02, help="the agent's sampling interval")
    args = parser.parse_args()
    torch = cuda_torch_here("agent_cost")
    if torch is None:
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from gpumemdoctor._agent.core import Agent

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device="cuda")

    def train_step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(50):
        train_step()
    torch.cuda.synchronize()

    with tempfile.TemporaryDirectory() as run_dir:
        agent = Agent(run_dir, args.interval)
        agent.shared.torch = torch
        agent.describe_devices()
        agent.prepare_reading()  # as at CUDA's start: without it no sample is taken
        agent.sampler.interval_s = 1e9  # no sample is ever due: the hook's own cost
        agent.sampler.last_sample_t = time.monotonic()
        hook_us = per_call_us(lambda: agent.on_step(explicit=False), 200_000)
        sample_us = per_call_us(lambda: agent.sampler.sample("time"), 2_000)

        from torch.optim.optimizer import register_optimizer_step_post_hook
        with_hook, without = [], []
        for _ in range(7):
            handle = register_optimizer_step_post_hook(agent._on_optimizer_step)
            with_hook.append(per_call_us(train_step, 2_000, repeats=1))
            torch.cuda.synchronize()
            handle.remove()
            without.append(per_call_us(train_step, 2_000, repeats=1))
            torch.cuda.synchronize()
        os.close(agent.shared.channel.fd)

    step_us = statistics.median(without)
    per_step_us = hook_us + sample_us * step_us / (args.interval * 1e6)
    print(f"device                     {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"step hook, no sample due   {hook_us:8.3f} us per step")
    print(f"one sample                 {sample_us:8.1f} us, once per {args.interval * 1e3:.0f} ms")
    print(f"tiny train step            {step_us:8.1f} us without the hook, "
          f"{statistics.median(with_hook):.1f} us with it (medians of 7 interleaved blocks)")
    print(f"predicted cost             {per_step_us:8.3f} us per step = "
          f"{per_step_us / step_us * 100:.3f}% of this step, "
          f"{sample_us / (args.interval * 1e6) * 100:.3f}% of any loop from sampling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
