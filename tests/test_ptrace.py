"""system/ptrace.py: the symbols read strictly from the mapped files, a pending call queued in a running
CPython through ptrace alone and run on its main thread, the process let go as it was (its sleeps go on,
its output is its own); and a debugger that fails on the tool's own test process never reaches the
target (inject.debugger_exec's canary)."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumemdoctor import errors
from gpumemdoctor.system import inject, ptrace

needs_ptrace = pytest.mark.skipif(not ptrace.supported(), reason="ptrace alone is for x86-64 Linux")
LOOP = "import sys, time\nn = 0\nprint('ready', flush=True)\nwhile n < int(sys.argv[1]):\n    time.sleep(0.01)\n    n += 1\nprint('ended', n, flush=True)\n"


def _target(tmp_path: Path, steps: int = 300) -> subprocess.Popen:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, str(script), str(steps)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _lines(marker: Path):
    def make(page: int, size: int) -> str:
        inner = (f"open({str(marker)!r}, 'w').write(repr((__import__('threading').current_thread().name, page_ok)))\n")
        body = f"page_ok = {page} != 0\n" + inner + ptrace.unmap_lines(page, size)
        guarded = "try:\n" + "\n".join("    " + line for line in body.splitlines()) + "\nexcept BaseException:\n    pass"
        return f"exec({guarded!r}, {{'__name__': '__test__'}})"
    return make


@needs_ptrace
def test_a_pending_call_runs_on_the_main_thread_and_the_program_goes_on(tmp_path):
    proc = _target(tmp_path)
    marker = tmp_path / "ran"
    try:
        done = ptrace.queue(proc.pid, _lines(marker))
        for _ in range(200):
            if marker.exists():
                break
            time.sleep(0.01)
        again = ptrace.queue(proc.pid, _lines(tmp_path / "again"))  # a second time works as the first
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert marker.read_text() == "('MainThread', True)"
    assert done["page"] and again["page"] and done["seconds"] < 5
    assert out.splitlines() == ["ended 300"] and err == ""  # its sleeps were not cut short, nothing printed
    assert proc.returncode == 0


@needs_ptrace
def test_the_symbols_are_found_where_the_interpreter_and_libc_are():
    found = ptrace.resolve(os.getpid(), ptrace.WANTED)
    assert set(found) == set(ptrace.WANTED)
    import ctypes

    libc = ctypes.CDLL(None)
    assert found["mmap"] == ctypes.cast(libc.mmap, ctypes.c_void_p).value
    assert found["Py_AddPendingCall"] == ctypes.cast(ctypes.pythonapi.Py_AddPendingCall, ctypes.c_void_p).value


def test_a_malformed_elf_file_is_refused():
    with pytest.raises(ValueError):
        ptrace.dynamic_symbols(b"not an elf file at all" * 4, {"x"})
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<QQ", header, 32, 64, 1 << 40)  # a section table far beyond the file
    struct.pack_into("<HHHH", header, 54, 56, 0, 64, 4)
    with pytest.raises(ValueError, match="outside the file"):
        ptrace.dynamic_symbols(bytes(header), {"x"})


@needs_ptrace
def test_a_process_that_is_gone_or_not_python():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(errors.NotAttachableError, match="not a Python process"):
            inject.ptrace_exec(sleeper.pid, lambda page, size: "pass")
        assert sleeper.poll() is None  # nothing was done to it
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(errors.NotAttachableError):
        inject.ptrace_exec(sleeper.pid, lambda page, size: "pass")


@pytest.mark.skipif(shutil.which("gdb") is None or not sys.platform.startswith("linux"), reason="needs gdb")
def test_a_debugger_that_fails_on_the_test_process_never_reaches_the_target(tmp_path):
    """gdb 13 cannot make inferior calls on some CPUs and kernels (AMX, kernel 6.18), and has left the
    process it failed in with a system call's restart code (OSError: [Errno 514]). Tried first on a
    process of the tool's own: where it fails, the target's loop runs to its end untouched; where it
    works, the lines run in the target."""
    proc = _target(tmp_path, steps=150)
    marker = tmp_path / "ran"
    try:
        try:
            inject.debugger_exec(inject.Debugger("gdb", shutil.which("gdb")), proc.pid,
                                 f"open({str(marker)!r}, 'w').write('yes')", 10.0, executable=sys.executable)
            failed = None
        except errors.AttachFailedError as exc:
            failed = str(exc)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    if failed is not None:
        assert "was not touched" in failed and not marker.exists(), failed
    else:
        assert marker.read_text() == "yes"
    assert out.splitlines() == ["ended 150"] and "Errno" not in err, err


FLOATS = ("import math, sys, threading\n"
          "def work():\n    s = 0.0\n    for i in range(1, 1_500_000):\n        s += math.sin(i) * 1.0000001 / i\n    return s\n"
          "r = {}\nt = threading.Thread(target=lambda: r.setdefault('t', work()))\nt.start()\n"
          "print('ready', flush=True)\nm = work()\nt.join()\nprint(repr(m), repr(r['t']), flush=True)\n")


@needs_ptrace
def test_stopped_in_its_floating_point_work_the_program_computes_the_same(tmp_path):
    """Two threads sum floats while the main thread is stopped and called into again and again: every
    register and the extended state (SSE, AVX) are put back, so the sums are bit for bit a plain run's;
    and lines that raise (here a NameError) are caught, so the pending call never raises SystemError."""
    script = tmp_path / "floats.py"
    script.write_text(FLOATS)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    queued = 0
    try:
        while proc.poll() is None and queued < 8:
            try:
                ptrace.queue(proc.pid, lambda page, size: "undefined_name_raises()\n" + ptrace.unmap_lines(page, size))
                queued += 1
            except (ptrace.PtraceError, FileNotFoundError):
                break  # it ended meanwhile
            time.sleep(0.02)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert queued >= 1
    assert out.splitlines()[-1] == plain.stdout.splitlines()[-1] and err == "", err
