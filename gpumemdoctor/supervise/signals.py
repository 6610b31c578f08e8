"""The signals sent to `gpumemdoctor run` while its target runs, passed on to the target: each once.

SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to the supervisor are sent on to the target,
but not as a second copy of one the target already has. The target is in the supervisor's process
group (so that a terminal, a CI runner or a scheduler that signals the group reaches it), and a signal
sent to the group reaches it from the kernel. A copy sent on top landed in the target's exit: a
traceback from one of its atexit callbacks, or Python's "lost sys.stderr". A terminal's Ctrl-C is told
by the terminal (its foreground group is ours). Without a terminal nothing says whom a signal was sent
to, so a witness does: a small process in the supervisor's group that blocks these signals, and says,
for each one the supervisor gets, whether it got it too. It is made before the target, with the
signals already blocked (a mask survives exec), so that every signal the group gets from then on is
kept for it: none can come between the target's start and the witness's, or kill it as it starts.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
# The kernel queues a group's signal to all its processes at once; the witness waits this long for
# its copy, a margin for the supervisor that runs its handler first. A signal sent to the supervisor
# alone goes on to the target this much later.
WITNESS_WAIT_S = 0.05
WITNESS_ANSWER_S = 1.0  # a witness that does not answer within this is given up

# Blocks the signals, so that they stay pending; for each signal number read, takes that signal if
# it came (or comes within the wait) and answers 1, else 0. Its input closes when the supervisor ends.
_WITNESS = r"""
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [int(s) for s in sys.argv[2:]])
for line in sys.stdin:
    got = signal.sigtimedwait([int(line)], float(sys.argv[1]))
    sys.stdout.write("1\n" if got else "0\n")
    sys.stdout.flush()
"""


class Forwarder:
    """Passes the signals on to the target: `catch` before it starts (those that come before it exists
    are kept for it), `target` once it has, `release` at the end."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.early: list[int] = []  # signals that came before the target existed: it has no copy
        self.previous: dict = {}
        self.witness: _Witness | None = None
        self.asking = False

    def catch(self) -> None:
        for name in NAMES:
            signum = getattr(signal, name, None)
            if signum is not None:
                self.previous[signum] = signal.signal(signum, self._on_signal)
        if not _has_terminal():
            self.witness = _Witness.start(list(self.previous))

    def target(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        for signum in self.early:
            self._send(signum, to_group=False)
        self.early.clear()

    def release(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        if self.witness is not None:
            self.witness.close()

    def _on_signal(self, signum, _frame) -> None:
        to_group = False
        if self.witness is not None and not self.asking:  # a signal during the question: sent on
            self.asking = True
            try:
                to_group = self.witness.also_got(signum)
            finally:
                self.asking = False
        if self.proc is None:
            self.early.append(signum)
        else:
            self._send(signum, to_group)

    def _send(self, signum: int, to_group: bool) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if signum in (signal.SIGINT, signal.SIGQUIT) and _terminal_delivered_it():
            return
        if to_group and _in_our_group(proc.pid):
            return  # the kernel gave the target its own copy
        try:
            proc.send_signal(signum)
        except OSError:
            pass


class _Witness:
    """The process that tells a signal sent to the whole group (it got one too) from one sent to the
    supervisor alone. Any failure (it died of a signal that came before it blocked them) ends it, and
    every signal is then sent on, as before."""

    def __init__(self, proc: subprocess.Popen):
        self.proc: subprocess.Popen | None = proc

    @classmethod
    def start(cls, signals: list[int]) -> _Witness | None:
        if not hasattr(signal, "sigtimedwait"):
            return None
        # Blocked here, around the fork, so that the witness starts with them blocked: one that
        # comes while it starts stays pending for it. Here they wait the few microseconds of the
        # fork, then reach the supervisor as they would have.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WITNESS, str(WITNESS_WAIT_S),
                                     *map(str, signals)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL)
        except OSError:
            return None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return cls(proc)

    def also_got(self, signum: int) -> bool:
        if self.proc is None:
            return False
        try:
            os.write(self.proc.stdin.fileno(), f"{signum}\n".encode())
            ready, _, _ = select.select([self.proc.stdout], [], [], WITNESS_ANSWER_S)
            answer = os.read(self.proc.stdout.fileno(), 2) if ready else b""
        except OSError:
            answer = b""
        if answer not in (b"1\n", b"0\n"):
            self.close()
            return False
        return answer == b"1\n"

    def close(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
        return True
    except OSError:
        return False


def _terminal_delivered_it() -> bool:
    """True when a terminal key press already sent this signal to the target's process group."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _in_our_group(pid: int) -> bool:
    """Whether the target is still in the supervisor's process group (it may have made its own)."""
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False
