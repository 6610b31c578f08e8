"""`watch --pid N --attach` on the CPU: the real CLI attaches to a running CPU-only Python program
(through ptrace alone on x86-64 Linux, system/ptrace.py; through gdb elsewhere or where asked), brings
the agent in, takes it out, and leaves the program as it was; and each refusal is one line with its
exit code. Skipped where neither way is there."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpumemdoctor import errors
from gpumemdoctor.live.attach import payload
from gpumemdoctor.system import agent_socket, inject, ptrace

DOUBLES = str(Path(__file__).parent / "doubles")
FAKE_CUDA = str(Path(__file__).parent / "doubles" / "fake_cuda.py")
NVML_STATE = {"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU", "total": 80 << 30, "used": 0,
                        "reserved": 0, "processes": []}]}
METHOD = "ptrace" if ptrace.supported() else "gdb"  # the way in where none is asked for
needs_gdb = pytest.mark.skipif(METHOD == "gdb" and shutil.which("gdb") is None,
                               reason="not x86-64 Linux, and gdb is not installed (.ci/run installs it)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run as another user")
NOBODY = 65534

# The program attached to: it imports torch (or a stand-in), writes its state as it started, then
# each time the test asks (a `check-N` file), and leaves when told (`stop`). Its state is what the
# agent may change: the functions it wraps, the collector's callbacks and settings, the import
# hooks, PyTorch's hook tables, threads, __main__'s names. (Not the exit hooks: atexit.unregister leaves
# an empty slot, which atexit._ncallbacks still counts.)
TARGET = r'''
import atexit, gc, json, os, sys, threading, time
control = sys.argv[1]
MODE = sys.argv[2]
if MODE == "torch":
    import torch
elif MODE == "fake-cuda":
    import importlib.util
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("fake_cuda", sys.argv[3])
    fake_cuda = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake_cuda)
    torch = fake_cuda.FakeTorch()
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_properties = lambda i: SimpleNamespace(name="fake", uuid="GPU-test-0")
    torch.cuda.get_allocator_backend = lambda: "native"
    torch.set(64 << 20)
    sys.modules["torch"] = torch
elif MODE == "enabled":
    import torch, gpumemdoctor
    gpumemdoctor.enable()
if MODE == "undumpable":
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0

def state():
    optim = sys.modules.get("torch.optim.optimizer")
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return {"os._exit": repr(os._exit), "bootstrap": repr(threading.Thread._bootstrap_inner),
            "backward": repr(getattr(getattr(sys.modules.get("torch"), "autograd", None), "backward", None)),
            "gc_callbacks": [repr(c) for c in gc.callbacks], "gc": [gc.isenabled(), gc.get_threshold()],
            "meta_path": [type(f).__name__ for f in sys.meta_path],
            "optimizer_hooks": [len(getattr(optim, t, {})) for t in ("_global_optimizer_pre_hooks",
                                                                     "_global_optimizer_post_hooks")],
            "queued": len(getattr(cuda, "_queued_calls", []) or []),
            "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
            "main": sorted(k for k in vars(sys.modules["__main__"]) if not k.startswith("__")),
            "agent": repr(getattr(sys.modules.get("gpumemdoctor._agent"), "_agent", None)),
            "history": [c["enabled"] for c in getattr(getattr(cuda, "memory", None), "history_calls", [])]}

def write(name):
    path = os.path.join(control, name)
    with open(path + ".tmp", "w") as f:
        json.dump(state(), f)
    os.replace(path + ".tmp", path)

write("state-0")
print("started", flush=True)
n = 0
while not os.path.exists(os.path.join(control, "stop")):
    n += 1
    for i in range(1, 4):
        if os.path.exists(os.path.join(control, f"check-{i}")) and not os.path.exists(os.path.join(control, f"state-{i}")):
            write(f"state-{i}")
    if MODE == "sleep":
        time.sleep(60)
    time.sleep(0.01)
print("ended", n > 0, flush=True)
'''


def _open_dir() -> Path:
    """A folder everyone may enter and write (for the tests that run as another user)."""
    folder = Path(tempfile.mkdtemp(prefix="gpumemdoctor-attach-test-"))
    folder.chmod(0o777)
    return folder


class Target:
    """The program above, running; `state(i)` asks for and reads its state."""

    def __init__(self, folder: Path, mode: str = "torch", python: str = sys.executable, flags: tuple = (),
                 user: int | None = None):
        self.folder = folder
        (folder / "target.py").write_text(TARGET)
        self.out = open(folder / "target.out", "w")
        self.proc = subprocess.Popen([python, *flags, str(folder / "target.py"), str(folder), mode, FAKE_CUDA],
                                     stdout=self.out, stderr=subprocess.STDOUT, cwd=folder,
                                     user=user, env={**os.environ, "NO_COLOR": "1"})
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while not (folder / "state-0").exists():
            assert self.proc.poll() is None, (folder / "target.out").read_text()
            assert time.monotonic() < deadline, "the target did not start"
            time.sleep(0.05)

    def state(self, i: int) -> dict:
        (self.folder / f"check-{i}").write_text("")
        path = self.folder / f"state-{i}"
        deadline = time.monotonic() + 30
        while not path.exists():
            assert time.monotonic() < deadline, "the target did not answer"
            time.sleep(0.05)
        return json.loads(path.read_text())

    def stop(self) -> str:
        (self.folder / "stop").write_text("")
        try:
            self.proc.wait(timeout=70)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.out.close()
        return (self.folder / "target.out").read_text()


@pytest.fixture
def folder():
    path = _open_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _watch(cli, target_pid: int, cwd: Path, *args: str, env: dict | None = None, timeout: float = 120):
    state = cwd / "nvml.json"
    if not state.exists():
        state.write_text(json.dumps(NVML_STATE))
    return cli("watch", "--pid", str(target_pid), "--attach", "--no-tui", *args, cwd=cwd, timeout=timeout,
               env={"PYTHONPATH": DOUBLES, "GPUMEMDOCTOR_TEST_NVML": str(state), **(env or {})})


def _leftovers(pid: int) -> list[str]:
    """What an agent could leave outside the program: its socket, a run folder of watch's."""
    found = [path for path in [agent_socket.socket_path(pid)] if os.path.exists(path)]
    found += [str(p) for p in Path(tempfile.gettempdir()).glob("gpumemdoctor-attach-*")
              if not p.name.startswith("gpumemdoctor-attach-test-") and (p / f"agent-{pid}.jsonl").exists()]
    return found


@needs_gdb
def test_attach_and_detach_leave_the_program_as_it_was(cli, folder):
    target = Target(folder)
    try:
        before = json.loads((folder / "state-0").read_text())
        first = _watch(cli, target.pid, folder, "--duration", "1.5", "-o", str(folder / "r1.json"))
        assert first.returncode == 0, first.stderr
        assert f"the agent is in process {target.pid}" in first.stderr
        assert "waiting for the program to start CUDA" in first.stdout  # a CPU build of torch
        after = target.state(1)
        second = _watch(cli, target.pid, folder, "--duration", "1", "-o", str(folder / "r2.json"))
        assert second.returncode == 0, second.stderr  # a second attach to the same process works
        again = target.state(2)
        assert _leftovers(target.pid) == []
    finally:
        out = target.stop()
    for state in (after, again):
        assert {k: v for k, v in state.items() if k != "main"} == {k: v for k, v in before.items() if k != "main"}
        assert set(state["main"]) - set(before["main"]) <= {"n", "i"}  # its own loop's names only
    assert state["agent"] == "None"
    # the program's output is its own, untouched
    assert [line for line in out.splitlines() if not line.startswith(("/", "  cpu ="))] == ["started", "ended True"]
    report = json.loads((folder / "r1.json").read_text())
    assert report["recording"]["target"]["attached"]["method"] == METHOD
    assert report["recording"]["target"]["attached"]["detached"]["where"] == "the main thread"
    notes = " ".join(report["recording"]["notes"])
    assert "starts at the attach" in notes and "without the exit probes" in notes
    if METHOD == "ptrace":  # how long its main thread was stopped for the attach, in the report's words
        stopped = report["recording"]["target"]["attached"]["stopped_s"]
        assert 0 < stopped < 5 and f"its main thread stopped {stopped * 1000:.1f} ms for it" in notes
    read = cli("report", str(folder / "r1.json"), cwd=folder)
    assert read.returncode == 0, read.stderr
    compared = cli("compare", str(folder / "r1.json"), str(folder / "r2.json"), cwd=folder)
    assert compared.returncode in (0, 10), compared.stderr


@needs_gdb
def test_the_agent_samples_serves_its_socket_and_turns_the_history_off(cli, folder):
    """Over the torch test double with CUDA started: the agent's sampling thread, its socket, PyTorch's
    memory history and the collector's callback come in with the attach and go with the detach."""
    target = Target(folder, mode="fake-cuda")
    try:
        before = json.loads((folder / "state-0").read_text())
        result = _watch(cli, target.pid, folder, "--duration", "2", "--interval", "0.2",
                        "-o", str(folder / "r.json"))
        assert result.returncode == 0, result.stderr
        after = target.state(1)
        assert _leftovers(target.pid) == []
    finally:
        target.stop()
    assert f"PID {target.pid} cuda:0: tensors 64.0 MiB" in result.stdout  # through its socket
    assert "allocated floor" in result.stdout
    assert before["history"] == [] and after["history"][0] == "all" and after["history"][-1] is None
    assert {k: v for k, v in after.items() if k not in ("history", "main")} == \
        {k: v for k, v in before.items() if k not in ("history", "main")}
    report = json.loads((folder / "r.json").read_text())
    restored = report["recording"]["target"]["attached"]["detached"]["restored"]
    assert "PyTorch's memory history (off)" in restored and "the agent's socket" in restored
    assert "the garbage collector's callback" in restored
    agent = next(a for a in report["recording"]["agents"] if a["pid"] == target.pid)
    assert agent["samples"] and agent["exited_normally"]


@needs_gdb
def test_the_payload_binds_nothing_in_main_and_prints_nothing():
    code = payload("/nonexistent/run-folder", os.getpid(), 0.02, 0.02)
    assert code.isascii() and code.startswith("exec(") and "\n" not in code
    namespace = {"__name__": "__main__"}
    exec(code, namespace)  # gpumemdoctor is importable here; the folder is not: arrive() writes nothing
    assert set(namespace) == {"__name__", "__builtins__"}


def test_a_missing_process_is_a_usage_error(cli, tmp_path):
    result = _watch(cli, 4000000, tmp_path, "--duration", "1")
    assert result.returncode == errors.EXIT_USAGE and "no process with PID 4000000" in result.stderr


def test_options_of_the_attach_need_it(cli, tmp_path):
    (tmp_path / "nvml.json").write_text(json.dumps(NVML_STATE))
    result = cli("watch", "--pid", str(os.getpid()), "-o", "r.json", "--duration", "1", cwd=tmp_path,
                 env={"PYTHONPATH": DOUBLES, "GPUMEMDOCTOR_TEST_NVML": str(tmp_path / "nvml.json")})
    assert result.returncode == errors.EXIT_USAGE and "go with --attach" in result.stderr


def test_not_a_python_process(cli, tmp_path):
    proc = subprocess.Popen(["sleep", "30"])
    try:
        result = _watch(cli, proc.pid, tmp_path, "--duration", "1")
    finally:
        proc.kill()
        proc.wait()
    assert result.returncode == errors.EXIT_NOT_ATTACHABLE, result.stderr
    assert "is not a Python process" in result.stderr and result.stderr.count("\n") <= 2


def test_no_debugger(cli, folder):
    target = Target(folder)
    try:
        named = _watch(cli, target.pid, folder, "--duration", "1", "--debugger", "/nonexistent/gdb")
        none = _watch(cli, target.pid, folder, "--duration", "1", env={"PATH": str(folder)})
    finally:
        target.stop()
    assert named.returncode == errors.EXIT_NO_DEBUGGER and "/nonexistent/gdb" in named.stderr
    if METHOD == "ptrace":  # no debugger is needed: ptrace alone
        assert none.returncode == 0 and "through ptrace" in none.stderr, none.stderr
    else:
        assert none.returncode == errors.EXIT_NO_DEBUGGER and "install the gdb package" in none.stderr
    assert _leftovers(target.pid) == []


@needs_gdb
def test_torch_not_imported(cli, folder):
    target = Target(folder, mode="plain")
    try:
        result = _watch(cli, target.pid, folder, "--duration", "1")
        after = target.state(1)
    finally:
        out = target.stop()
    assert result.returncode == errors.EXIT_NOT_ATTACHABLE, result.stderr
    assert "has not imported torch" in result.stderr
    assert after["agent"] == "None" and "ended True" in out


@needs_gdb
def test_gpumemdoctor_not_importable_there(cli, folder):
    target = Target(folder, mode="plain", flags=("-S",))  # no site-packages: neither torch nor gpumemdoctor
    try:
        result = _watch(cli, target.pid, folder, "--duration", "1")
    finally:
        out = target.stop()
    assert result.returncode == errors.EXIT_NOT_ATTACHABLE, result.stderr
    assert "gpumemdoctor cannot be imported in process" in result.stderr and "pip install" in result.stderr
    assert "ended True" in out and "Error" not in out


@needs_gdb
def test_an_agent_already_in_it(cli, folder):
    target = Target(folder, mode="enabled")
    try:
        result = _watch(cli, target.pid, folder, "--duration", "1")
    finally:
        target.stop()
    assert result.returncode == errors.EXIT_NOT_ATTACHABLE, result.stderr
    assert "already runs gpumemdoctor's agent (started by gpumemdoctor.enable())" in result.stderr


@needs_gdb
def test_a_main_thread_that_runs_no_python(cli, folder):
    """The main thread sleeps in C for a minute: no safe point comes, the attach gives up, the program
    goes on untouched (no KeyboardInterrupt from the debugger's interrupt; through ptrace, the queued call
    runs when the sleep ends and does nothing, the watch's folder being gone)."""
    target = Target(folder, mode="sleep")
    try:
        result = _watch(cli, target.pid, folder, "--duration", "1", "--attach-timeout", "2")
    finally:
        out = target.stop()
    assert result.returncode == errors.EXIT_ATTACH_FAILED, result.stderr
    assert "ran no Python code for 2 s" in result.stderr, result.stderr
    if METHOD == "ptrace":
        assert "the agent was not started" in result.stderr and "then does nothing" in result.stderr
    else:
        assert "nothing was changed" in result.stderr
    assert "ended True" in out and "Traceback" not in out


_NOBODY_PYTHON: list = []


def _nobody_python() -> tuple[str, str] | None:
    """(an interpreter user nobody can run, the PYTHONPATH that gives it gpumemdoctor and its
    dependencies): this one, or the system's of the same version with this one's site-packages (a
    Python under root's home is closed to other users); None where there is none."""
    if _NOBODY_PYTHON:
        return _NOBODY_PYTHON[0]
    import sysconfig

    path = os.pathsep.join([DOUBLES, str(Path(__file__).parent.parent), sysconfig.get_paths()["purelib"]])
    found = None
    for python in (sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"):
        try:
            done = subprocess.run([python, "-c", "import psutil, click, rich, gpumemdoctor.cli"], user=NOBODY,
                                  group=NOBODY, env={"PYTHONPATH": path}, capture_output=True, timeout=60, cwd="/")
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            found = (python, path)
            break
    _NOBODY_PYTHON.append(found)
    return found


def _as_nobody(pid: int, cwd: Path):
    """watch --attach run as user nobody (the test runs as root)."""
    python = _nobody_python()
    if python is None:
        pytest.skip("no Python here that user nobody may run with gpumemdoctor's dependencies")
    state = cwd / "nvml.json"
    state.write_text(json.dumps(NVML_STATE))
    state.chmod(0o644)
    env = {"PYTHONPATH": python[1], "GPUMEMDOCTOR_TEST_NVML": str(state), "NO_COLOR": "1", "HOME": str(cwd),
           "PATH": os.environ["PATH"]}
    return subprocess.run([python[0], "-m", "gpumemdoctor", "watch", "--pid", str(pid), "--attach",
                           "--no-tui", "--duration", "1"], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env, user=NOBODY, group=NOBODY)


@needs_root
def test_a_process_of_another_user(folder):
    target = Target(folder)  # root's
    try:
        result = _as_nobody(target.pid, folder)
    finally:
        target.stop()
    assert result.returncode == errors.EXIT_ATTACH_REFUSED, result.stderr
    assert f"process {target.pid} belongs to root, not to you" in result.stderr


@needs_root
@needs_gdb
def test_ptrace_not_allowed(folder):
    """A program that made itself not dumpable cannot be traced by its own (non-root) user."""
    python = _nobody_python()
    if python is None:
        pytest.skip("no Python here that user nobody may run with gpumemdoctor's dependencies")
    target = Target(folder, mode="undumpable", user=NOBODY, python=python[0])
    try:
        result = _as_nobody(target.pid, folder)
    finally:
        out = target.stop()
    assert result.returncode == errors.EXIT_ATTACH_REFUSED, result.stderr
    assert "kernel.yama.ptrace_scope" in result.stderr and "CAP_SYS_PTRACE" in result.stderr
    assert "ended True" in out


def test_the_ptrace_checks_name_the_setting(monkeypatch):
    monkeypatch.setattr(inject, "_read_int", lambda path: 3)
    with pytest.raises(errors.AttachRefusedError, match=r"kernel.yama.ptrace_scope = 3"):
        inject.check_ptrace(os.getpid())
    monkeypatch.setattr(inject, "_read_int", lambda path: 2)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(inject, "_has_cap", lambda bit: False)
    with pytest.raises(errors.AttachRefusedError, match=r"ptrace_scope = 2.*CAP_SYS_PTRACE"):
        inject.check_ptrace(os.getpid())
    monkeypatch.setattr(inject, "_read_int", lambda path: 1)
    with pytest.raises(errors.AttachRefusedError, match=r"ptrace_scope = 1.*CAP_SYS_PTRACE"):
        inject.check_ptrace(1)
    monkeypatch.setattr(inject, "_has_cap", lambda bit: True)
    inject.check_ptrace(1)  # with the capability: allowed


def test_the_debugger_is_found_as_asked(monkeypatch, tmp_path):
    fake = tmp_path / "my-lldb"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert inject.find_debugger(str(fake)) == inject.Debugger("lldb", str(fake))
    monkeypatch.setenv(inject.ENV_DEBUGGER, str(fake))
    assert inject.find_debugger().path == str(fake)
    monkeypatch.setenv(inject.ENV_DEBUGGER, str(tmp_path / "none"))
    with pytest.raises(errors.NoDebuggerError, match="GPUMEMDOCTOR_GDB"):
        inject.find_debugger()


def test_the_python_of_a_process():
    found = inject.python_of(os.getpid())
    assert found.version == sys.version_info[:2]
    assert inject.python_of(4000000).version is None


@pytest.mark.skipif(shutil.which("lldb") is None, reason="lldb is not installed")
def test_lldb_where_it_is_asked_for(cli, folder):
    """The same attach and leave through lldb (where gdb is missing, or named with --debugger)."""
    target = Target(folder)
    try:
        before = json.loads((folder / "state-0").read_text())
        result = _watch(cli, target.pid, folder, "--duration", "1", "--debugger", shutil.which("lldb"),
                        "-o", str(folder / "r.json"))
        after = target.state(1)
    finally:
        out = target.stop()
    assert result.returncode == 0, result.stderr
    assert "through lldb" in result.stderr
    assert {k: v for k, v in after.items() if k != "main"} == {k: v for k, v in before.items() if k != "main"}
    assert "ended True" in out
