"""Turn gpumemdoctor's work for this process off and on again, inside the measured program.

Used by the workloads' `--ab` mode (benchmarks/loop_ab.py). Between two processes a loop of
1 ms steps varies by up to a third on the lent machines, far more than the 5% it must be held
to; inside one process, blocks of steps with the tool's work off and on by turns compare the
same interpreter, memory layout, clocks and CPU. Off means everything the tool does while a
steady loop runs:
  - the agent's optimizer step hook (each step; a sample at a step once per interval),
  - the agent's sampling thread (it wakes once per interval),
  - the agent's garbage-collector callback,
  - the supervisor process, which polls NVML every 5 ms: stopped with SIGSTOP.
Not switched: the agent's socket thread, which sleeps in accept() until `watch` connects.
Turning the sampling thread on again starts a new one, which takes one extra sample first
(the thread's start-up reading): a cost counted against the tool.

This reaches into the agent's internals on purpose; it is benchmark code, never the tool's.
Without the tool (a plain run) nothing is found and nothing is switched: the blocks then
measure the method's own noise (an A/A comparison).
"""
from __future__ import annotations

import gc
import os
import signal
import sys
import time

PARTS = ("all", "agent", "supervisor")  # what --ab-parts / loop_ab.py --parts may switch


class ToolSwitch:
    """`parts`: what is switched; "agent" or "supervisor" alone leaves the other running throughout,
    to see which of them a slowdown comes from."""

    def __init__(self, torch, parts: str = "all"):
        self.parts = parts
        module = sys.modules.get("gpumemdoctor._agent") if parts != "supervisor" else None
        self.agent = module._current() if module is not None else None
        self.hooks = None
        self.hook_key = None
        self.gc_callback = None
        self.supervisor = _supervisor_pid() if parts != "agent" else None
        self.is_on = True
        agent = self.agent
        if agent is None:
            return
        from torch.optim import optimizer as optim_module

        hooks = getattr(optim_module, "_global_optimizer_post_hooks", None)
        if hooks is not None:
            hook = agent._on_optimizer_step
            self.hooks = hooks
            self.hook_key = next((k for k, v in hooks.items() if v == hook), None)
        if agent.collections is not None and agent.collections.callback in gc.callbacks:
            self.gc_callback = agent.collections.callback

    def describe(self) -> str:
        if self.parts == "supervisor":
            return f"supervisor pid {self.supervisor} only" if self.supervisor else "no supervisor: nothing is switched"
        if self.agent is None:
            return "no agent in this process: nothing is switched (A/A)"
        parts = [f"agent pid {self.agent.shared.pid}",
                 "step hook" if self.hook_key is not None else "NO step hook",
                 "sampling thread" if self.agent.timer.thread is not None else "NO sampling thread",
                 "gc callback" if self.gc_callback is not None else "no gc callback",
                 f"supervisor pid {self.supervisor}" if self.supervisor else "NO supervisor"]
        if self.parts == "agent":
            parts[-1] = "the supervisor left running"
        return ", ".join(parts)

    def off(self) -> None:
        if not self.is_on:
            return
        self.is_on = False
        if self.agent is not None:
            self.agent.timer.stop()  # the thread ends within one nap (50 ms) and is joined
            if self.hook_key is not None:
                self.hooks.pop(self.hook_key, None)
            if self.gc_callback is not None and self.gc_callback in gc.callbacks:
                gc.callbacks.remove(self.gc_callback)
        if self.supervisor:
            os.kill(self.supervisor, signal.SIGSTOP)
            _wait_until_stopped(self.supervisor)

    def on(self) -> None:
        if self.is_on:
            return
        self.is_on = True
        if self.supervisor:
            os.kill(self.supervisor, signal.SIGCONT)
        if self.agent is None:
            return
        if self.gc_callback is not None:
            gc.callbacks.append(self.gc_callback)
        if self.hook_key is not None:
            self.hooks[self.hook_key] = self.agent._on_optimizer_step
        restart_sampling(self.agent)


def restart_sampling(agent) -> None:
    """A new sampling thread for the agent, whose last one was stopped (a stopped thread cannot start again)."""
    from gpumemdoctor._agent.readings.sampler import SamplingThread

    agent.timer = SamplingThread(agent.shared, agent.sampler, agent.trace, agent.phase_watch, agent.start_devices)
    agent.timer.start()


def _supervisor_pid() -> int | None:
    """The parent, when it is `gpumemdoctor run` (the supervisor starts the target itself)."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    return parent if b"gpumemdoctor\0run" in cmdline else None


def _wait_until_stopped(pid: int, timeout_s: float = 1.0) -> None:
    """SIGSTOP takes effect when the kernel next schedules the process: wait for its state T."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in (b"T", b"t"):
            return
        time.sleep(0.001)
