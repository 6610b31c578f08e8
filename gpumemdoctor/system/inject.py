"""Run a few lines of Python inside another running CPython, for `watch --attach`.

Three ways in, chosen by the target's Python and the machine:

- Python 3.14 and newer: `sys.remote_exec` (PEP 768), called by the target's own interpreter (it
  must be the same version as the target's), with a script file. The target runs it on its main
  thread at its next safe point.
- elsewhere on x86-64 Linux, ptrace alone (ptrace.py): the interpreter is asked for a pending call of
  `PyRun_SimpleString` with the lines, and the process let go at once, its registers as they were.
- elsewhere, or where --debugger (or GPUMEMDOCTOR_GDB) names one, gdb (lldb where gdb is missing):
  the debugger stops the process and asks its interpreter for a pending call (`Py_AddPendingCall`) of a harmless function, `PyCallable_Check`,
  with a NULL argument (it returns 0), and puts a breakpoint on that function's first instruction,
  taken only with a NULL argument. The interpreter runs pending calls on its main thread between
  two bytecodes, holding the GIL, never inside an allocation: where the breakpoint stops it, the
  debugger removes the breakpoint, calls `PyRun_SimpleStringFlags` with the lines, and detaches.
  Nothing is called while the process is stopped at an arbitrary point but `Py_AddPendingCall`,
  which allocates nothing. A main thread that runs no Python (blocked in C) never gets there: after
  `timeout_s` the debugger is interrupted, the breakpoint removed and the process let go, unchanged
  but for the queued call of PyCallable_Check(NULL), which does nothing.

The lines themselves are the caller's; they must catch everything (an exception would be printed
on the target's standard error). The outcome is for the caller to read where the lines put it (a
file): this module only says whether they ran, and turns what went wrong into one error with the
fix (errors.py): no debugger, ptrace refused, not a Python process, no safe point in time.
"""
from __future__ import annotations

import errno
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from ..errors import AttachFailedError, AttachRefusedError, NoDebuggerError, NotAttachableError

ENV_DEBUGGER = "GPUMEMDOCTOR_GDB"  # the debugger's binary (gdb, or a name with lldb in it)
MARK = "GPUMEMDOCTOR:"
# The register that holds a function's first argument, for the breakpoint's condition.
FIRST_ARGUMENT = {"x86_64": "$rdi", "amd64": "$rdi", "aarch64": "$x0", "arm64": "$x0"}
YAMA = "/proc/sys/kernel/yama/ptrace_scope"
CAP_SYS_PTRACE = 19


@dataclass(frozen=True)
class Debugger:
    kind: str  # "gdb" or "lldb"
    path: str


@dataclass(frozen=True)
class PythonOf:
    """What a process's Python is, read from outside (its executable and its mappings)."""

    version: tuple[int, int] | None  # None: no libpython and no pythonX.Y executable seen
    executable: str | None
    readable: bool = True  # False: the kernel refused to show its mappings (ptrace's access check)


def python_of(pid: int) -> PythonOf:
    """The target's Python version, from a mapped libpythonX.Y or its pythonX.Y executable."""
    readable = True
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        exe, readable = None, False
    except OSError:
        exe = None
    version = None
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r"/libpython(\d)\.(\d+)[^/]*\.so", line)
                if m:
                    version = (int(m.group(1)), int(m.group(2)))
                    break
    except PermissionError:
        readable = False
    except OSError:
        pass
    if version is None and exe:
        m = re.fullmatch(r"python(\d)\.(\d+)[a-z]*", os.path.basename(exe))
        if m:
            version = (int(m.group(1)), int(m.group(2)))
    return PythonOf(version, exe, readable)


def find_debugger(path: str | None = None) -> Debugger:
    """The debugger to attach with: `path` (--debugger), else GPUMEMDOCTOR_GDB, else gdb on PATH,
    else lldb on PATH."""
    given = path or os.environ.get(ENV_DEBUGGER)
    if given:
        found = shutil.which(given) if os.sep not in given else (given if os.access(given, os.X_OK) else None)
        if found is None:
            where = "--debugger" if path else ENV_DEBUGGER
            raise NoDebuggerError(f"{where} names {given!r}, which is not an executable: give the path of gdb "
                                  "(or lldb)")
        return Debugger("lldb" if "lldb" in os.path.basename(given) else "gdb", found)
    for kind in ("gdb", "lldb"):
        found = shutil.which(kind)
        if found:
            return Debugger(kind, found)
    raise NoDebuggerError("attaching to a Python older than 3.14 needs gdb, and neither gdb nor lldb is "
                          "installed: install the gdb package (apt-get install gdb, dnf install gdb), or name "
                          f"one with --debugger PATH or {ENV_DEBUGGER}")


def check_ptrace(pid: int) -> None:
    """Refuse now, in one line, where the kernel will not let this process trace `pid`. Nothing is
    changed: the setting and the capability are the administrator's."""
    scope = _read_int(YAMA)
    capable = os.geteuid() == 0 or _has_cap(CAP_SYS_PTRACE)
    tracer = _tracer(pid)
    if tracer:
        raise AttachRefusedError(f"process {pid} is being traced by process {tracer} (a debugger, strace, "
                                 "py-spy?): only one tracer at a time; end or detach it and try again")
    if scope == 3:
        raise AttachRefusedError(f"ptrace is turned off on this machine (kernel.yama.ptrace_scope = 3): no "
                                 f"process can be attached to until a reboot; watch PID {pid} without --attach")
    if scope == 2 and not capable:
        raise AttachRefusedError(f"ptrace is allowed only to administrators here (kernel.yama.ptrace_scope = 2): "
                                 "run watch --attach as root or with CAP_SYS_PTRACE")
    if scope == 1 and not capable and not _descends_from_us(pid):
        raise AttachRefusedError(
            f"ptrace is allowed here only to a process's ancestors (kernel.yama.ptrace_scope = 1), and process "
            f"{pid} was not started by this shell's watch: run watch --attach as root or with CAP_SYS_PTRACE "
            "(sudo -E), or ask an administrator about kernel.yama.ptrace_scope (gpumemdoctor never changes it)")


def ptrace_refused(pid: int) -> AttachRefusedError:
    """The debugger was refused (EPERM) though the checks above let it try."""
    scope = _read_int(YAMA)
    setting = f"kernel.yama.ptrace_scope = {scope}" if scope is not None else "kernel.yama.ptrace_scope"
    return AttachRefusedError(
        f"the kernel refused to let the debugger trace process {pid} (ptrace: operation not permitted; "
        f"{setting}): in a container it needs CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE), and a process "
        "that made itself not dumpable can only be traced by root; gpumemdoctor changes neither")


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _has_cap(bit: int) -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _tracer(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1]) or None
    except (OSError, ValueError, IndexError):
        pass
    return None


def _descends_from_us(pid: int) -> bool:
    me = os.getpid()
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if ppid == me:
            return True
        if ppid <= 1:
            return False
        pid = ppid
    return False


# -- sys.remote_exec (Python 3.14+) ----------------------------------------------------------

def remote_exec(python: str, pid: int, script: str, timeout_s: float) -> None:
    """Queue `script` (a file) for the target's main thread through sys.remote_exec, called by the
    target's own interpreter `python` (isolated: nothing of the caller's environment in it)."""
    code = f"import sys; sys.remote_exec({pid}, {script!r})"
    try:
        done = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise AttachFailedError(f"the Python of process {pid} ({python}) cannot be run from here: it is needed "
                                "to call sys.remote_exec") from None
    except subprocess.TimeoutExpired:
        raise AttachFailedError(f"sys.remote_exec({pid}) did not return within {timeout_s:.0f} s") from None
    if done.returncode == 0:
        return
    text = (done.stderr or done.stdout).strip().splitlines()
    last = text[-1] if text else f"status {done.returncode}"
    if "ermission" in last or "not permitted" in last:
        raise ptrace_refused(pid)
    if "disable" in last.lower() or "remote debugging" in last.lower():
        raise NotAttachableError(f"process {pid} does not allow remote execution ({last}): it was started with "
                                 "-X disable_remote_debug or PYTHON_DISABLE_REMOTE_DEBUG, or built without it")
    raise AttachFailedError(f"sys.remote_exec({pid}) failed: {last}")


# -- ptrace alone (x86-64 Linux) ------------------------------------------------------------

def ptrace_exec(pid: int, make_code) -> dict:
    """Queue the lines make_code(page, size) returns in process `pid` (ptrace.py). Raises one error with
    the fix; the process is let go as it was, whatever happened."""
    from . import ptrace

    try:
        return ptrace.queue(pid, make_code)
    except LookupError as exc:
        raise NotAttachableError(f"process {pid} is not a Python process, or its Python hides its symbols (no "
                                 f"{exc} among them)") from None
    except ptrace.PtraceError as exc:
        if exc.code == errno.EPERM:
            raise ptrace_refused(pid) from None
        if exc.code == errno.ESRCH:
            raise NotAttachableError(f"process {pid} ended before it could be attached to") from None
        raise AttachFailedError(f"attaching to process {pid} failed, and it was let go as it was: {exc}") from None
    except FileNotFoundError:
        raise NotAttachableError(f"process {pid} ended before it could be attached to") from None
    except OSError as exc:
        raise AttachFailedError(f"attaching to process {pid} failed, and it was let go as it was: {exc}") from None


# -- gdb and lldb ----------------------------------------------------------------------------

def c_string(text: str) -> str:
    """`text` as a C string literal for the debugger: ASCII only, escaped."""
    text.encode("ascii")  # the caller passes anything else as hex
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _register() -> str:
    machine = platform.machine().lower()
    register = FIRST_ARGUMENT.get(machine)
    if register is None:
        raise NotAttachableError(f"attaching through a debugger is known only on x86-64 and ARM64 Linux, and this "
                                 f"machine is {machine}: use Python 3.14 or newer (sys.remote_exec)")
    return register


def gdb_script(code: str, register: str) -> str:
    """What gdb runs once attached (see the module's docstring); MARK lines tell how far it got."""
    return "\n".join([
        f"echo {MARK} attached\\n",
        "set $gmd_queued = (int)Py_AddPendingCall((void*)&PyCallable_Check, (void*)0)",
        f'printf "{MARK} queued %d\\n", $gmd_queued',
        "if $gmd_queued != 0",
        "  detach",
        "  quit",
        "end",
        f"break *PyCallable_Check if {register} == 0",
        "commands",
        "  silent",
        "  delete",
        f'  printf "{MARK} gil %d\\n", (int)PyGILState_Check()',
        f'  printf "{MARK} ran %d\\n", (int)PyRun_SimpleStringFlags({c_string(code)}, (void*)0)',
        "  detach",
        "  quit",
        "end",
        f"echo {MARK} waiting\\n",
        "continue",
        f"echo {MARK} interrupted\\n",  # only after the interrupt: the breakpoint's commands quit
        "delete",
        "detach",
        "quit",
        ""])


def lldb_commands(code: str, register: str) -> list[str]:
    """What lldb runs once attached: the same steps as gdb_script. Every call cast to its C type (a
    Python without debug information has none; one with it must match them), the marks echoed by the
    shell (lldb's `script` needs its Python, which some distributions' lldb lacks)."""
    mark = f"platform shell echo {MARK}"
    return [
        f"{mark} attached",
        # (the function's address through a variable: lldb 14 cannot pass `&function` as an argument)
        "expr -- unsigned long $gmd_check = (unsigned long)&PyCallable_Check",
        "expr -- ((int (*)(void *, void *))Py_AddPendingCall)((void *)$gmd_check, (void *)0)",
        f"{mark} queued 0",
        f"breakpoint set -a $gmd_check -c '{register} == 0' -o true -N gpumemdoctor",
        "breakpoint command add -s command gpumemdoctor",
        f"{mark} gil 1",
        f"expr -- ((int (*)(const char *, void *))PyRun_SimpleStringFlags)({c_string(code)}, (void *)0)",
        f"{mark} ran 0",
        "process detach",
        "DONE",
        f"{mark} waiting",
        "process continue",
        "breakpoint delete -f",
        "process detach",
    ]


CANARY = "import time\nwhile True:\n    time.sleep(0.01)"


def debugger_exec(debugger: Debugger, pid: int, code: str, timeout_s: float, executable: str | None = None) -> dict:
    """Run `code` in process `pid` through the debugger (see the module's docstring). Returns what it
    said: {"gil": the GIL held where it ran (1), "seconds": how long}. Raises one error with the fix.
    With `executable` (the target's Python), the debugger is first tried on a process of that Python
    of this tool's own: a debugger that cannot call into it (gdb 13 on some CPUs and kernels) fails
    there, and the target is never touched."""
    if executable:
        canary = subprocess.Popen([executable, "-I", "-S", "-c", CANARY], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(0.2)
            _debugger_run(debugger, canary.pid, "pass", min(timeout_s, 10.0))
        except (AttachFailedError, NotAttachableError) as exc:
            from . import ptrace

            instead = "; leave --debugger (and GPUMEMDOCTOR_GDB) out to attach through ptrace alone" \
                if ptrace.supported() else ""
            raise AttachFailedError(f"{debugger.kind} failed on a test process of the same Python, so process {pid} "
                                    f"was not touched: {exc}{instead}") from None
        finally:
            canary.kill()
            canary.wait()
    return _debugger_run(debugger, pid, code, timeout_s)


def _debugger_run(debugger: Debugger, pid: int, code: str, timeout_s: float) -> dict:
    register = _register()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpumemdoctor-attach-") as folder:
        if debugger.kind == "gdb":
            script = os.path.join(folder, "attach.gdb")
            with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="ascii") as f:
                f.write(gdb_script(code, register))
            argv = [debugger.path, "-batch", "-nx", "-nw", "-p", str(pid), "-iex", "set auto-load off",
                    "-iex", "set auto-solib-add off", "-iex", "set pagination off", "-iex", "set confirm off",
                    "-ex", "sharedlibrary libpython", "-ex", "sharedlibrary libc[.-]", "-x", script]
        else:
            script = os.path.join(folder, "attach.lldb")
            with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="ascii") as f:
                f.write("\n".join(lldb_commands(code, register)) + "\n")
            argv = [debugger.path, "--batch", "--no-lldbinit", "-p", str(pid), "-s", script]
        out = _run_debugger(argv, timeout_s)
    if debugger.kind == "lldb":
        try:
            os.kill(pid, signal.SIGCONT)  # lldb has been seen to leave a process stopped
        except OSError:
            pass
    return _outcome(debugger, pid, out, timeout_s, time.monotonic() - started)


def _run_debugger(argv: list[str], timeout_s: float) -> str:
    """The debugger's output; interrupted (SIGINT: it stops the target, removes the breakpoint, lets
    it go) when the target reached no safe point in time, killed if even that does not end it."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return out
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out + f"\n{MARK} timed out\n"


def _outcome(debugger: Debugger, pid: int, out: str, timeout_s: float, seconds: float) -> dict:
    marks = dict(re.findall(rf"^{MARK} (\w+) ?(-?\d*)", out, re.M))
    if "ran" in marks:
        return {"gil": int(marks["gil"]) if marks.get("gil") else None, "seconds": round(seconds, 3),
                "ran": int(marks["ran"]) if marks["ran"] else None}
    if "attached" not in marks:
        if re.search(r"ptrace: Operation not permitted|attach failed.*(permitted|permission)", out, re.I):
            raise ptrace_refused(pid)
        if re.search(r"ptrace: No such process|No such process|does not exist", out, re.I):
            raise NotAttachableError(f"process {pid} ended before the debugger could attach")
        raise AttachFailedError(f"{debugger.kind} could not attach to process {pid}: {_last_line(out)}")
    if "queued" not in marks or ("waiting" not in marks and marks.get("queued") != "0"):
        if re.search(r'No symbol "Py_AddPendingCall"|Py_AddPendingCall.*(undeclared|not found|no symbol)', out, re.I):
            raise NotAttachableError(f"process {pid} is not a Python process (no Py_AddPendingCall in it), or its "
                                     "Python hides its symbols")
        if marks.get("queued") not in (None, "0"):
            raise AttachFailedError(f"the Python of process {pid} refused the pending call (its queue is full): "
                                    "try again")
        raise AttachFailedError(f"{debugger.kind} stopped before asking process {pid}'s Python: {_last_line(out)}")
    if "timed" in marks or "interrupted" in marks:
        raise AttachFailedError(
            f"the main thread of process {pid} ran no Python code for {timeout_s:.0f} s (blocked in a C call, a "
            "long sleep, or waiting for the GPU): nothing was changed in it; try again while it runs "
            "Python, or with a longer --attach-timeout")
    raise AttachFailedError(f"{debugger.kind} ended before the code ran in process {pid}: {_last_line(out)}")


def _last_line(out: str) -> str:
    """The debugger's last word: its last error where it printed one, else its last line."""
    lines = [line.strip() for line in out.splitlines() if line.strip() and not line.startswith(MARK)]
    errors = [line for line in lines if re.search(r"couldn't|cannot|error|failed", line, re.I)
              and "auto-load" not in line.lower()]
    if errors:
        return errors[-1][:200]
    return lines[-1][:200] if lines else "no output"
