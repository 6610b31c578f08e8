"""`watch --pid N --attach`: gpumemdoctor's agent brought into a running Python program, watched, and
taken out again.

Nothing is changed in the program until every check has passed: the process exists, is the user's own
(or the tool runs as root), runs CPython 3.9 or newer, and the kernel lets this process trace it
(system/inject.py). Then, in a run folder of the watch's own (0700, the agent's files in it 0600; given
to the target's user when root attaches to another user's program), the payload: a few lines that
import gpumemdoctor's agent in the target and call `_agent.attach.arrive` with the folder, run on the
target's main thread through sys.remote_exec (3.14+), a pending call queued through ptrace alone
(system/ptrace.py, x86-64 Linux), or a debugger (gdb, lldb: elsewhere, or where --debugger names
one). The agent answers in the folder:
`attach.json` (started, or why not: no torch, an agent already, gpumemdoctor not importable there),
then its record file as under `run`, read as it grows (`poll`: recording/agent_files.py, with the
process tree's NVML figures from supervise/tree.py's TreeWatch, as `run`'s supervisor reads them).
`stop` asks the agent to leave (its `stop` file) and waits for its `detached.json`; `recording`
builds the recording of the attached stretch as `run`'s supervisor builds a run's; `close` removes
the run folder.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from .. import __version__
from ..contract import INTERVAL_DEFAULT_S, MAX_PAUSE_DEFAULT_S, MIN_GROWTH_BYTES
from ..errors import AttachFailedError, AttachRefusedError, NotAttachableError, UsageError
from ..growth import floor_growth
from ..system import inject, procs, ptrace

PROTOCOL = 1  # _agent/attach.py's PROTOCOL: the files and arrive()'s arguments
STATUS_FILE, STOP_FILE, DETACHED_FILE = "attach.json", "stop", "detached.json"  # as _agent/attach.py names them
MIN_PYTHON = (3, 9)
REMOTE_EXEC_PYTHON = (3, 14)
ATTACH_TIMEOUT_S = 30.0  # for the main thread to reach a safe point, then for the agent to answer
LEAVE_TIMEOUT_S = 30.0  # for the agent to leave: its search in a copy (5 s budget, 10 s slack) included


@dataclass
class Attached:
    """What the agent said when it started, and when it left."""

    pid: int
    method: str  # "sys.remote_exec", "ptrace", "gdb" or "lldb"
    python: str | None
    status: dict
    t: float  # when it answered, from the watch's start
    attach_s: float  # how long the attach took, the debugger's and the agent's start together
    detached: dict | None = None
    notes: list[str] = field(default_factory=list)
    stopped_s: float | None = None  # through ptrace: how long the program's main thread was stopped for it


def check(pid: int, debugger: str | None = None) -> tuple[str, inject.PythonOf, inject.Debugger | None]:
    """Every check before anything is changed in the process: (method, its Python, the debugger)."""
    info = procs.info(pid)
    if pid <= 0 or info is None:
        raise UsageError(f"no process with PID {pid} here (it may have exited, or live in another PID namespace)")
    if pid == os.getpid():
        raise UsageError("watch --attach cannot attach to itself")
    owner = procs.owner(pid)
    me = os.geteuid()
    if owner is not None and me != 0 and any(uid != me for uid in owner):
        raise AttachRefusedError(f"process {pid} belongs to {info.username or f'user {owner[0]}'}, not to you: "
                                 "attach only to your own processes (or as root)")
    if info.status == "zombie":
        raise NotAttachableError(f"process {pid} has exited (a zombie): there is nothing left to attach to")
    python = inject.python_of(pid)
    if not python.readable:  # the same check as ptrace's: a process not dumpable, or not ours after all
        raise inject.ptrace_refused(pid)
    if python.version is None:
        raise NotAttachableError(f"process {pid} ({python.executable or 'its executable is not readable'}) is not "
                                 "a Python process: neither a pythonX.Y executable nor libpythonX.Y is in it")
    if python.version < MIN_PYTHON:
        raise NotAttachableError(f"process {pid} runs Python {python.version[0]}.{python.version[1]}: the agent "
                                 "needs CPython 3.9 or newer")
    named = debugger is not None or bool(os.environ.get(inject.ENV_DEBUGGER))
    if python.version >= REMOTE_EXEC_PYTHON and not named:
        inject.check_ptrace(pid)
        return "sys.remote_exec", python, None
    if ptrace.supported() and not named:
        inject.check_ptrace(pid)
        return "ptrace", python, None
    found = inject.find_debugger(debugger)
    inject.check_ptrace(pid)
    return found.kind, python, found


def payload(run_dir: str, watcher_pid: int, interval_s: float, max_pause_s: float, tail: str = "") -> str:
    """The lines run in the target: import the agent and call arrive(); where gpumemdoctor cannot be
    imported there, say so in the status file; where the watch's run folder is gone (the watch gave up
    before the program's main thread ran Python), nothing. Then `tail` (ptrace.py's page given back).
    One statement (an exec in a namespace of its own): nothing is bound in the program's __main__, and
    nothing escapes to its output."""
    inner = "\n".join([
        "import os, sys, json",
        f"d = bytes.fromhex('{run_dir.encode().hex()}').decode()",
        "if not os.path.isdir(d):",
        "    pass",
        "else:",
        "  try:",
        "    from gpumemdoctor._agent.attach import arrive",
        "  except BaseException as e:",
        "    try:",
        "        import gpumemdoctor",
        "        v = getattr(gpumemdoctor, '__version__', None)",
        "    except BaseException:",
        "        v = None",
        "    s = {'ok': False, 'error': 'import', 'message': (type(e).__name__ + ': ' + str(e))[:300],",
        "         'version': v, 'protocol': None, 'pid': os.getpid(), 'python': sys.version.split()[0],",
        "         'executable': sys.executable}",
        f"    p = os.path.join(d, '{STATUS_FILE}')",
        "    fd = os.open(p + '.tmp', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)",
        "    with os.fdopen(fd, 'w') as f:",
        "        json.dump(s, f)",
        "    os.replace(p + '.tmp', p)",
        "  else:",
        f"    arrive(d, {int(watcher_pid)}, {float(interval_s)!r}, {float(max_pause_s)!r})",
    ])
    guarded = "try:\n" + "\n".join("    " + line for line in inner.splitlines()) + "\nexcept BaseException:\n    pass"
    if tail:
        guarded += "\ntry:\n" + "\n".join("    " + line for line in tail.splitlines()) + "\nexcept BaseException:\n    pass"
    return f"exec({guarded!r}, {{'__name__': '__gpumemdoctor_attach__'}})"


class Attach:
    """One attach: its run folder, the agent's answers and files, the stop."""

    def __init__(self, pid: int, t0: float, debugger: str | None = None, interval_s: float = INTERVAL_DEFAULT_S,
                 max_pause_s: float = MAX_PAUSE_DEFAULT_S, timeout_s: float = ATTACH_TIMEOUT_S):
        self.pid = pid
        self.t0 = t0
        self.method, self.python, self.debugger = check(pid, debugger)
        self.info = procs.info(pid)
        self.interval_s = interval_s
        self.max_pause_s = max_pause_s
        self.timeout_s = timeout_s
        self.run_dir: str | None = None
        self.queued: dict | None = None  # ptrace.queue's answer: how long the process was stopped
        self.attached: Attached | None = None
        self.agents = None  # recording.agent_files.AgentFiles, once attached
        self.tree = None  # supervise.tree.TreeWatch

    def open(self, devices: list, measure_gpu: bool) -> Attached:
        """Bring the agent in; raises one error with the fix, having changed nothing, where it cannot."""
        from ..recording.agent_files import AgentFiles
        from ..supervise.tree import TreeWatch

        self.run_dir = tempfile.mkdtemp(prefix="gpumemdoctor-attach-")  # 0700
        owner = procs.owner(self.pid)
        if os.geteuid() == 0 and owner is not None and owner[1] != 0:  # root attaching to a user's program
            os.chown(self.run_dir, owner[1], procs.group(self.pid) or -1)
        started = time.monotonic()
        code = payload(self.run_dir, os.getpid(), self.interval_s, self.max_pause_s)
        if self.method == "sys.remote_exec":
            script = os.path.join(self.run_dir, "payload.py")
            with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="ascii") as f:
                f.write(code + "\n")
            if owner is not None and os.geteuid() == 0:
                os.chown(script, owner[1], -1)
            inject.remote_exec(self.python.executable, self.pid, script, self.timeout_s)
        elif self.method == "ptrace":
            self.queued = inject.ptrace_exec(
                self.pid, lambda page, size: payload(self.run_dir, os.getpid(), self.interval_s, self.max_pause_s,
                                                     tail=ptrace.unmap_lines(page, size)))
        else:
            inject.debugger_exec(self.debugger, self.pid, code, self.timeout_s, executable=self.python.executable)
        status = self._await_status(started)
        self.attached = Attached(pid=self.pid, method=self.method, python=status.get("python"), status=status,
                                 t=round(time.monotonic() - self.t0, 6), attach_s=round(time.monotonic() - started, 3),
                                 stopped_s=self.queued.get("seconds") if self.queued else None)
        self.agents = AgentFiles(self.run_dir, self.t0, self.pid)
        self.tree = TreeWatch(self.pid, self.t0, devices, measure_gpu)
        return self.attached

    def _await_status(self, started: float) -> dict:
        path = os.path.join(self.run_dir, STATUS_FILE)
        deadline = started + self.timeout_s + (0.0 if self.method == "ptrace" else 5.0)  # both return before it runs
        while not os.path.exists(path):
            if time.monotonic() > deadline and self.method == "ptrace":
                raise AttachFailedError(
                    f"the main thread of process {self.pid} ran no Python code for {self.timeout_s:.0f} s (blocked in a "
                    "C call, a long sleep, or waiting for the GPU): the agent was not started. The queued call stays "
                    "until that thread runs Python again, and then does nothing (the watch's folder is gone). Try "
                    "again while it runs Python, or with a longer --attach-timeout")
            if time.monotonic() > deadline:
                raise AttachFailedError(f"the code sent to process {self.pid} did not answer within "
                                        f"{self.timeout_s + 5:.0f} s: its main thread may be blocked outside Python")
            if not procs.same_process(self.pid, self.info.create_time if self.info else None):
                raise AttachFailedError(f"process {self.pid} ended during the attach")
            time.sleep(0.02)
        try:
            with open(path, encoding="utf-8") as f:
                status = json.load(f)
        except (OSError, ValueError) as exc:
            raise AttachFailedError(f"the agent's answer could not be read ({exc})") from None
        if not isinstance(status, dict):
            raise AttachFailedError("the agent's answer is not what it should be")
        if status.get("ok") is True and status.get("protocol") == PROTOCOL and status.get("version") == __version__:
            return status
        raise refusal(self.pid, status)

    # -- while attached ---------------------------------------------------------------------
    def poll(self) -> None:
        """The agent's new records and the tree's NVML figures (each watch sample)."""
        if self.tree is not None:
            try:
                self.tree.poll()
            except Exception:
                self.tree.measure_gpu = False
        if self.agents is not None:
            self.agents.poll()

    def agent(self):
        """The agent's recording so far (its root records) and its samples, or (None, [])."""
        if self.agents is None:
            return None, []
        return self.agents.current(self.pid)

    def leak(self) -> list[dict]:
        """The running judgement from the agent's own samples: per device, the allocated floor's growth
        ({"torch_index", "rate_bytes_per_min" (None: not enough samples yet; 0: flat), "samples"})."""
        agent, samples = self.agent()
        out = []
        for index in sorted({r.torch_index for s in samples for r in s.readings}):
            points = [(s.t, r.allocated_bytes) for s in samples for r in s.readings
                      if r.torch_index == index and r.allocated_bytes is not None]
            rate = None
            if len(points) >= 8:
                fit = floor_growth([t for t, _ in points], [a for _, a in points], MIN_GROWTH_BYTES)
                rate = fit.rate_bytes_per_x * 60 if fit is not None else 0.0
            out.append({"torch_index": index, "rate_bytes_per_min": rate, "samples": len(points)})
        return out

    # -- the end -----------------------------------------------------------------------------
    def stop(self, ended: str) -> dict | None:
        """Ask the agent to leave and wait for it (not when the process has exited: its exit probes
        ran); its DETACHED_FILE, or None."""
        if self.run_dir is None or self.attached is None:
            return None
        if ended == "exited":
            self.attached.notes.append("the process exited while the agent was in: its exit probes ran, as under "
                                       "`run`, and the agent went with it")
            return None
        fd = os.open(os.path.join(self.run_dir, STOP_FILE), os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        path = os.path.join(self.run_dir, DETACHED_FILE)
        deadline = time.monotonic() + LEAVE_TIMEOUT_S
        while not os.path.exists(path):
            if not procs.same_process(self.pid, self.info.create_time if self.info else None):
                self.attached.notes.append("the process exited while the agent was leaving it")
                return None
            if time.monotonic() > deadline:
                self.attached.notes.append(f"the agent did not say within {LEAVE_TIMEOUT_S:.0f} s that it had left "
                                           f"process {self.pid}: it leaves by itself once this watch has ended")
                return None
            self.poll()
            time.sleep(0.05)
        try:
            with open(path, encoding="utf-8") as f:
                self.attached.detached = json.load(f)
        except (OSError, ValueError):
            return None
        return self.attached.detached

    def recording(self, ended: str, started_wall: float, duration_s: float, versions: dict, devices: list):
        """The recording of the attached stretch, built as `run`'s supervisor builds a run's."""
        from ..supervise.tree import collect

        tree = self.tree
        try:
            tree.after_exit() if ended == "exited" else tree.poll()
        except Exception:
            pass
        options = _Options(target_args=_argv(self.info), poll_interval_s=0.0, measure_gpu=tree.measure_gpu)
        recording = collect(options, tree, self.agents, self.pid, 0, started_wall=started_wall,
                            duration_s=duration_s, versions=versions, devices=devices, notes=[], cost={},
                            oom_kills=None, host=_host())
        attached = self.attached
        recording.target.update({"exit_code": None, "signal": None, "cwd": procs.cwd(self.pid) or recording.target["cwd"],
                                 "attached": {"method": attached.method, "at_s": attached.t,
                                              "attach_s": attached.attach_s, "stopped_s": attached.stopped_s,
                                              "ended": ended,
                                              "detached": attached.detached}})
        recording.notes[:0] = self.notes(ended)
        return recording

    def notes(self, ended: str) -> list[str]:
        """What the report says of an attached recording, before anything else."""
        a = self.attached
        stopped = (f" (its main thread stopped {a.stopped_s * 1000:.1f} ms for it)"
                   if a.stopped_s is not None else "")
        out = [f"attached to a running process (PID {self.pid}, Python {a.python}) through {a.method} at "
               f"{a.t:.1f} s, in {a.attach_s:.2f} s{stopped}; everything here starts at the attach: the allocator's "
               "history, and so the allocating lines, covers only what was allocated since, and the context's "
               "figure (NVML's less PyTorch's at the first readings) holds whatever lay outside PyTorch then"]
        if ended != "exited":
            out.append("the process was still running at the end: the agent was taken out without the exit probes "
                       "(gc.collect(), synchronize, empty_cache would have changed the running program), so "
                       "garbage cycles are not told apart from live tensors, nor cache from memory that "
                       "stream work held; its exit status is not known")
        d = a.detached
        if d:
            out.append(f"the agent left from {d.get('where')} in {d.get('seconds')} s (the program paused "
                       f"{(d.get('main_pause_s') or 0) * 1000:.1f} ms for it); put back: "
                       f"{', '.join(d.get('restored') or []) or 'nothing'}"
                       + (f"; left: {'; '.join(d['left'])}" if d.get("left") else ""))
        out.extend(a.notes)
        return out

    def close(self) -> None:
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None


@dataclass(frozen=True)
class _Options:
    """What tree.collect reads of `run`'s supervise.supervisor.RunOptions."""

    target_args: list
    poll_interval_s: float
    measure_gpu: bool


def _argv(info) -> list[str]:
    """What followed `python` on the target's command line (as `run`'s target arguments)."""
    cmdline = list(info.cmdline or []) if info is not None else []
    if cmdline and "python" in os.path.basename(cmdline[0]):
        return cmdline[1:]
    return cmdline


def _host() -> str | None:
    import socket

    try:
        return socket.gethostname() or None
    except OSError:
        return None


def refusal(pid: int, status: dict):
    """The error for an agent that did not start, from what the payload or the agent said."""
    error = status.get("error")
    version = status.get("version")
    where = f"process {pid}'s Python ({status.get('executable') or 'unknown'}, {status.get('python') or '?'})"
    if error == "import":
        return NotAttachableError(f"gpumemdoctor cannot be imported in {where}: {status.get('message')}; install "
                                  f"gpumemdoctor {__version__} into that environment ({status.get('executable') or 'its python'} "
                                  "-m pip install gpumemdoctor)")
    if version != __version__ or status.get("protocol") != PROTOCOL:
        return NotAttachableError(f"{where} has gpumemdoctor {version or 'of an unknown version'}, and this one is "
                                  f"{__version__}: install the same version in both")
    if error == "no-torch":
        return NotAttachableError(f"process {pid} has not imported torch: the agent reads PyTorch's allocator, so "
                                  "there is nothing for it to see yet; watch it without --attach (NVML only), or "
                                  "attach once it has imported torch")
    if error == "agent-present":
        return NotAttachableError(f"process {pid} already runs gpumemdoctor's agent (started by {status.get('by')}): "
                                  f"watch it without --attach, which reads that agent's socket")
    return AttachFailedError(f"the agent could not start in process {pid}: {status.get('message') or error}")
