"""The program's threads and forks: each thread's start and end, the interpreter's shutdown, and the
agent in a forked child.

Each thread's entry point names the stacks that ran in it (for the holder search), and a
thread that changed GPU memory while it ran is recorded with the figures before and after.
The exit probes are made at the start of the interpreter's shutdown (`install_shutdown_hook`),
before it joins the program's threads and runs its exit hooks: what those let go of (an executor's
workers and their thread-local tensors, joined by concurrent.futures at exit) was held until the end.
A forked child cannot use CUDA: it lets go of its parent's record file and socket, and gets
an agent of its own that records that it exists (the package's `_after_fork_in_child`).
"""
from __future__ import annotations

import os
import sys
import threading
import time

from .neutral import quiet_gc

MAX_THREAD_RECORDS = 1000


class Captured:
    """The program's threads at one moment, taken on the program's thread just before a fork: a copy
    of the process has only the thread that forked it. No more than the interpreter hands over at
    once (each thread's innermost frame, the threads' names); the copy reads the rest, frames'
    callers and their locals, from its frozen image (roots.Roots). `own`: the agent's threads."""

    __slots__ = ("frames", "names", "alive", "own")

    def __init__(self):
        threads = threading.enumerate()
        self.own = {t.ident for t in threads if t.name.startswith("gpumemdoctor-")}
        self.names = {t.ident: t.name for t in threads}
        self.alive = set(self.names.values())
        self.frames = sys._current_frames()  # ident -> its innermost frame


class ThreadWatch:
    """What each thread ran, and the threads that changed GPU memory."""

    def __init__(self, shared, sampler):
        self.shared = shared
        self.sampler = sampler  # the devices read as a thread starts and ends
        self.entries: dict = {}  # (file, function) -> names of the threads that ran it
        self.records = 0

    def started(self, thread):
        """From the thread itself, as it starts: what it runs, and the memory before it."""
        if thread.name.startswith("gpumemdoctor-"):
            return None
        entry = _thread_entry(thread)
        if entry is not None:
            names = self.entries.setdefault(entry, [])
            if len(names) < 100:
                names.append(thread.name)
        if not self.shared.devices or self.records >= MAX_THREAD_RECORDS:
            return None
        with quiet_gc():
            return (time.monotonic(), entry, self.sampler.read_devices())

    def ended(self, thread, token) -> None:
        t0, entry, before = token
        with quiet_gc():
            after = self.sampler.read_devices()
        if [r[1:4] + r[5:6] for r in before] == [r[1:4] + r[5:6] for r in after]:
            return  # the thread changed nothing on the GPU
        self.records += 1
        self.shared.channel.write({"type": "thread", "name": thread.name, "entry": list(entry) if entry else None,
                                   "t0": t0, "t": time.monotonic(), "d0": before, "d1": after})

    def names(self, alive: set | None = None) -> dict:
        """(file, function) -> the names of the threads that ran it, for the holder search; `alive`:
        the names of the threads running (Captured.alive in a copy of the process), else now."""
        if alive is None:
            alive = {t.name for t in threading.enumerate()}
        return {entry: [n if n in alive else f"{n} (ended)" for n in names[:4]]
                + ([f"and {len(names) - 4} more"] if len(names) > 4 else [])
                for entry, names in self.entries.items()}


def _thread_entry(thread):
    """(file, function) of the code a thread runs: its target, or the run() of its class."""
    target = getattr(thread, "_target", None)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None and type(thread).run is not threading.Thread.run:
        code = getattr(type(thread).run, "__code__", None)
    return (code.co_filename, code.co_name) if code is not None else None


def install_hook(current) -> None:
    """Tell the agent when each thread starts and ends: names for the stacks that ran in a
    thread, and the memory a thread left behind. One wrapper around threading's own start-up;
    `current()` is the process's agent at the time (None when there is none)."""
    original = getattr(threading.Thread, "_bootstrap_inner", None)
    if original is None or getattr(original, "_gpumemdoctor", False):
        return

    def _bootstrap_inner(self):
        agent = current()
        token = None
        if agent is not None and agent.shared.pid == os.getpid():
            try:
                token = agent.threads.started(self)
            except Exception:
                token = None
        try:
            original(self)
        finally:
            if token is not None:
                try:
                    agent.threads.ended(self, token)
                except Exception:
                    pass

    _bootstrap_inner._gpumemdoctor = True
    threading.Thread._bootstrap_inner = _bootstrap_inner


def leave_parent(parent) -> None:
    """In a forked child: the parent's record file and local socket stay the parent's."""
    channel = parent.shared.channel
    if channel.fd is not None:
        os.close(channel.fd)
    if parent.server is not None:
        parent.server.forget()  # the socket is the parent's: the child neither serves nor removes it


WORKER = os.path.join("concurrent", "futures", "thread.py")  # where an executor's idle worker waits


def install_shutdown_hook(current) -> None:
    """Make the exit probes when the main thread's program has ended and before the interpreter's
    shutdown lets anything go: Py_Finalize calls `threading._shutdown`, looked up on the module then,
    which runs threading's exit hooks (concurrent.futures' joins every executor's workers, whose
    thread-local tensors go with them) and joins the non-daemon threads; atexit's hooks, the agent's
    own among them, run only after it. Where a non-daemon thread is still at work (not an executor's
    worker waiting for work), the program has not ended: the probes wait for the agent's atexit hook,
    as before. `current()` is the process's agent; the shutdown itself is unchanged."""
    original = getattr(threading, "_shutdown", None)
    if original is None or getattr(original, "_gpumemdoctor", False):
        return

    def _shutdown():
        agent = current()
        if agent is not None and agent.shared.pid == os.getpid() and agent.shared.devices and not agent.shared.finished:
            try:
                busy, idle = threads_at_shutdown()
                agent.shutdown = {"before_shutdown": not busy, "threads_joined": len(idle) if not busy else 0,
                                  "waiting": (busy or idle)[:8]}
                if not busy:
                    agent.at_exit()
            except BaseException:
                pass
        return original()

    _shutdown._gpumemdoctor = True
    _shutdown.__name__, _shutdown.__qualname__, _shutdown.__doc__ = (original.__name__, original.__qualname__,
                                                                     original.__doc__)
    threading._shutdown = _shutdown


def threads_at_shutdown() -> tuple[list[str], list[str]]:
    """The non-daemon threads the shutdown will join (the main thread and the agent's aside): those
    still at work, and the executors' workers waiting for work (their innermost frame concurrent.futures'
    `_worker`, blocked on its queue), by name."""
    frames = sys._current_frames()
    workers = getattr(sys.modules.get("concurrent.futures.thread"), "_threads_queues", None) or {}
    busy, idle = [], []
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is main or t.daemon or t.name.startswith("gpumemdoctor-"):
            continue
        frame = frames.get(t.ident)
        waiting = (frame is not None and frame.f_code.co_name == "_worker"
                   and frame.f_code.co_filename.endswith(WORKER))
        try:
            waiting = waiting and t in workers
        except TypeError:
            waiting = False
        (idle if waiting else busy).append(t.name)
    del frames
    return busy, idle
