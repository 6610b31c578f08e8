"""The agent inside the measured program: started here, at most one per process.

The bootstrap sitecustomize calls `start()` in every Python process of a run; it does
nothing unless GPUMEMDOCTOR_RUN_DIR is set. `watch --attach` brings the same agent into a running
program and takes it out again (attach.py). `enable()` and `step()` are behind
gpumemdoctor.enable() and gpumemdoctor.step(). The agent itself is `core.Agent`, whose
docstring says what happens when. Its life cycle and what its parts share are the modules beside
this one; its parts are grouped by job in three packages: readings/ (samples, and the records made
at moments of the run or at its exit), peak/ (what made the peaks) and search/ (the holder search).
Every entry point is guarded: a failure disables the agent, never the program.
"""
from __future__ import annotations

import os
import time

from . import threads
from .search import forked
from .core import Agent
from .exit import install_hard_exit
from ..contract import ENV_RUN_DIR, interval_from_env

_agent: Agent | None = None  # this process's agent


def start(started: float | None = None) -> None:
    """Start the agent in this process if the environment asks for it; twice is harmless.
    `started`: time.perf_counter() before the bootstrap imported the agent (its start's cost)."""
    global _agent
    if _agent is not None and _agent.shared.pid == os.getpid():
        return
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return
    try:
        agent = Agent(run_dir, interval_from_env(os.environ))
        _begin(agent)
        if started is not None:
            agent.shared.cost["bootstrap_s"] = time.perf_counter() - started
        _agent = agent
    except Exception:
        _agent = None


def enable() -> None:
    """Start the agent and its local socket in this process (see gpumemdoctor.enable)."""
    global _agent
    try:
        if _agent is None or _agent.shared.pid != os.getpid():
            agent = Agent(os.environ.get(ENV_RUN_DIR), interval_from_env(os.environ))
            _begin(agent)
            _agent = agent
        _agent.start_server()
    except Exception:
        pass


def step() -> None:
    """Mark the end of one step of the program's loop (see gpumemdoctor.step)."""
    agent = _agent
    if agent is not None:
        agent.on_step(explicit=True)


def _current() -> Agent | None:
    return _agent


_fork_hook = False  # registered once per interpreter: an attach after a detach finds it there (attach.py)


def _begin(agent: Agent) -> None:
    """The process's hooks (forks, threads), then the agent's start, which may start its thread."""
    global _fork_hook
    if hasattr(os, "register_at_fork") and not _fork_hook:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook = True
    threads.install_hook(_current)
    threads.install_shutdown_hook(_current)
    install_hard_exit(_current)
    agent.begin()


def _after_fork_in_child() -> None:
    global _agent
    if forked.in_copy():
        return  # the agent's own copy, searching: it writes to the parent's record file and leaves
    parent = _agent
    _agent = None
    if parent is None:
        return
    attachment = parent.attachment
    if attachment is not None:  # brought in by `watch --attach`: not into the program's children
        attachment.leave_in_child()
        return
    try:
        threads.leave_parent(parent)
    except Exception:
        pass
    try:
        # CUDA cannot be used in a forked child; the child records that it exists.
        child = Agent(parent.shared.run_dir, parent.sampler.base_interval_s)
        child.begin(forked_from=parent.shared.pid)
        _agent = child
    except Exception:
        _agent = None
