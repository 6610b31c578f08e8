"""Runs a holder search in a copy-on-write copy of the process (os.fork), so that the program
goes on while the copy searches a frozen image of its heap.

The program pauses only for the fork itself (its page tables are copied: about 11 ms per GiB of
the process's own memory on an H100 machine); then each page either side writes is copied once.
The copy never touches CUDA: it reads Python objects and the allocator's host-side bookkeeping,
writes its one record to the agent's file, and leaves with os._exit (no atexit, no flushing of
the program's buffers, no destructors). Its output goes to /dev/null; it dies at its own deadline
(SIGALRM) and soon after the program (it looks at its parent every ORPHAN_CHECK_S of its CPU time,
SIGVTALRM), and the parent reaps it. Not PR_SET_PDEATHSIG: that follows the thread that forked,
and a copy made on a worker thread (an out-of-memory error there) would die with that thread.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import sys
import time
import warnings

ORPHAN_CHECK_S = 0.05  # of the copy's CPU time, between two looks at whether its program still runs
MAX_PAUSE_S = 0.08  # a fork that would pause the program longer than this is not made
PAUSE_S_PER_GIB = 0.011  # measured on the lent H100 machine (kernel 6.18): 21-23 ms at 1.5 GiB, 104-124 at 9.7
_in_copy = False  # True in the copy: the agent's own after-fork hook must not start an agent there
_THREADS_WARNING = r"This process \(pid=\d+\) is multi-threaded"
_kept: list = []


def in_copy() -> bool:
    return _in_copy


def private_bytes() -> int | None:
    """The process's own resident memory (resident minus shared pages): what a fork copies the
    page tables of."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def expected_pause_s() -> float | None:
    size = private_bytes()
    return None if size is None else size / (1 << 30) * PAUSE_S_PER_GIB


class Copy:
    """A running copy: its pid, when it was made, how long the program paused for it."""

    def __init__(self, pid: int, t: float, pause_s: float, deadline: float):
        self.pid = pid
        self.t = t
        self.pause_s = pause_s
        self.deadline = deadline
        self.status: int | None = None  # its exit status once reaped; -signal when killed

    def poll(self) -> bool:
        """True once the copy is gone (reaped here, or by the program itself)."""
        if self.status is not None:
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.status = 0
            return True
        if pid == 0:
            if time.monotonic() > self.deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                self.status = -signal.SIGKILL
                return True
            return False
        self.status = os.waitstatus_to_exitcode(status)
        return True


def start(search, deadline_s: float) -> Copy | str:
    """Fork; in the copy, run `search()` and leave. In the program, a Copy, or why no copy was
    made (a string)."""
    global _in_copy
    if not hasattr(os, "fork"):
        return "this platform has no fork"
    pause = expected_pause_s()
    if pause is not None and pause > MAX_PAUSE_S:
        return (f"a copy of this process ({private_bytes() / (1 << 30):.1f} GiB of its own memory) would "
                f"pause it for about {pause * 1000:.0f} ms")
    t = time.monotonic()
    started = time.perf_counter()
    program = os.getpid()
    _in_copy = True
    try:
        with warnings.catch_warnings():
            # Python 3.12 warns that forking a threaded process may deadlock the child: the copy
            # runs only this code, which takes no lock another thread could hold.
            warnings.filterwarnings("ignore", message=_THREADS_WARNING, category=DeprecationWarning)
            pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - a failed fork must never reach the program
        _in_copy = False
        return f"fork failed: {type(exc).__name__}: {exc}"
    if pid == 0:
        _run_copy(search, deadline_s, program)  # never returns
    _in_copy = False
    pause_s = time.perf_counter() - started
    return Copy(pid, t, pause_s, time.monotonic() + deadline_s)


def _run_copy(search, deadline_s: float, program: int) -> None:
    try:
        gc.disable()
        for sig in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.alarm(max(1, math.ceil(deadline_s)))

        def orphaned(*_):  # the program has ended: nobody waits for this search any more
            if os.getppid() != program:
                os._exit(0)

        orphaned()
        signal.signal(signal.SIGVTALRM, orphaned)
        signal.setitimer(signal.ITIMER_VIRTUAL, ORPHAN_CHECK_S, ORPHAN_CHECK_S)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # The program's streams are kept referenced, never flushed nor freed (freeing one would
        # flush the program's buffered output a second time, from here): the copy writes to
        # /dev/null through streams of its own.
        _kept.extend((sys.stdout, sys.stderr))
        sys.stdout = sys.stderr = open(null, "w", closefd=False)
        search()
    except BaseException:  # noqa: BLE001
        pass
    finally:
        os._exit(0)
