"""Runs a holder search in a copy-on-write copy of the process (os.fork), so that the program
goes on while the copy searches a frozen image of its heap.

The program pauses only for the fork itself (its page tables are copied: 26-33 ms per GiB of a CUDA
program's own memory on the lent H100 machine) and the little work before it (roots.capture); then
each page either side writes is copied once. A fork whose pause, with that work, is expected to
pass MAX_PAUSE_S is not made (`declined`): the estimate starts at PAUSE_S_PER_GIB and, after each
fork of the process, takes the highest of its latest measured figures (`calibrate`).
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

from ...contract import max_pause_from_env

ORPHAN_CHECK_S = 0.05  # of the copy's CPU time, between two looks at whether its program still runs
# The longest pause a copy may cost the program (issue 31): the work on its thread before the fork
# and the fork itself. A copy expected to pause it longer is not made; the exit search covers growth.
MAX_PAUSE_S = max_pause_from_env(os.environ)  # 20 ms unless `run --max-pause` says otherwise
# At an out-of-memory error the program is failing anyway: its search is not a pause in a step, and
# is held only to the old ceiling (or to --max-pause, if higher).
MAX_OOM_PAUSE_S = max(0.08, MAX_PAUSE_S)
# The first estimate of a fork's pause, per GiB of the process's own resident memory: the first forks
# of real programs on the lent H100 machine (Lightning, Hugging Face: 29-31 ms at 0.9-1.1 GiB) measured
# 26-33 ms per GiB, so a CUDA program of a GiB or more is not copied during the run at the default
# 20 ms limit; the probes (peak.py) name its holders then. After each fork of this process the
# estimate is the highest of the latest CALIBRATION_FORKS measured figures.
PAUSE_S_PER_GIB = 0.03
CALIBRATION_FORKS = 4
# A fork's fixed cost is not spread over a small process's few pages: its pause is counted per GiB
# of at least this much memory, measured and estimated alike.
MIN_GIB = 0.25
_measured: list = []  # seconds per GiB of this process's latest forks (a child of the program inherits them)
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


def pause_s_per_gib() -> float:
    """The estimate's figure: the highest of the latest measured forks, or PAUSE_S_PER_GIB before any."""
    return max(_measured) if _measured else PAUSE_S_PER_GIB


def expected_pause_s(size: int | None = None) -> float | None:
    """How long a fork of the process would pause it, from its own resident memory."""
    size = private_bytes() if size is None else size
    return None if size is None else max(size / (1 << 30), MIN_GIB) * pause_s_per_gib()


def calibrate(pause_s: float, size: int) -> None:
    """A fork of `size` bytes of own memory paused the process `pause_s`: the estimate follows."""
    _measured.append(pause_s / max(size / (1 << 30), MIN_GIB))
    del _measured[:-CALIBRATION_FORKS]


def declined(spent_s: float = 0.0, limit_s: float | None = None, size: int | None = None) -> dict | None:
    """Why a copy would not be made now, with its figures (`why`, `pause_s`, `limit_s`,
    `private_bytes`), or None. `spent_s`: the program has already paused this long for it; `limit_s`:
    MAX_PAUSE_S as it is when asked (a benchmark lifts it); `size`: the process's own memory, if read."""
    limit_s = MAX_PAUSE_S if limit_s is None else limit_s
    if not hasattr(os, "fork"):
        return _not_made("this platform has no fork", None, limit_s, None)
    size = private_bytes() if size is None else size
    pause = expected_pause_s(size)
    if pause is None or pause + spent_s <= limit_s:
        return None
    pause += spent_s
    return _not_made(f"a copy of this process ({size / (1 << 30):.1f} GiB of its own memory) would pause it for "
                     f"about {pause * 1000:.0f} ms; the limit is {limit_s * 1000:.0f} ms (run --max-pause)",
                     round(pause, 4), limit_s, size)


def _not_made(why: str, pause_s: float | None, limit_s: float, size: int | None) -> dict:
    return {"why": why, "pause_s": pause_s, "limit_s": limit_s, "private_bytes": size}


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


def start(search, deadline_s: float, spent_s: float = 0.0, limit_s: float | None = None) -> Copy | dict:
    """Fork; in the copy, run `search()` and leave. In the program, a Copy, or why no copy was
    made (`declined`'s dict). `spent_s`: what the program has already paused for this copy."""
    global _in_copy
    limit_s = MAX_PAUSE_S if limit_s is None else limit_s
    size = private_bytes()  # (read once: the program is paused already)
    why = declined(spent_s, limit_s, size)
    if why is not None:
        return why
    t = time.monotonic()
    program = os.getpid()
    _in_copy = True
    try:
        with warnings.catch_warnings():
            # Python 3.12 warns that forking a threaded process may deadlock the child: the copy
            # runs only this code, which takes no lock another thread could hold.
            warnings.filterwarnings("ignore", message=_THREADS_WARNING, category=DeprecationWarning)
            started = time.perf_counter()
            pid = os.fork()
            pause_s = time.perf_counter() - started
    except BaseException as exc:  # noqa: BLE001 - a failed fork must never reach the program
        _in_copy = False
        return _not_made(f"fork failed: {type(exc).__name__}: {exc}", None, limit_s, size)
    if pid == 0:
        _run_copy(search, deadline_s, program)  # never returns
    _in_copy = False
    if size is not None:
        calibrate(pause_s, size)
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
