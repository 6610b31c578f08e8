"""The agent's local socket without a GPU: who may reach it, what it answers, when it goes."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpumemdoctor.system import agent_socket

TARGET = """
import os, sys, time
import gpumemdoctor
gpumemdoctor.enable()
gpumemdoctor.enable()  # twice is harmless
if len(sys.argv) > 1:  # a forked child that exits normally must leave the parent's socket alone
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    os.waitpid(pid, 0)
print("ready", flush=True)
sys.stdin.readline()  # run until told to stop
"""


@pytest.fixture
def runtime(monkeypatch):
    # A short path of its own: a socket's path is limited to 107 bytes (AF_UNIX), which pytest's
    # tmp_path passes once its run counter has three digits.
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="gmd-", dir="/tmp"))
    folder.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEMDOCTOR_")}
    proc = subprocess.Popen([sys.executable, "-c", TARGET, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=10)


def raw(pid: int, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(agent_socket.socket_path(pid))
        sock.sendall(request)
        return sock.recv(65536)


def test_private_folder_and_socket_file(runtime):
    proc = start()
    try:
        path = Path(agent_socket.socket_path(proc.pid))
        assert path.parent == runtime / f"gpumemdoctor-{os.getuid()}"
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0
        reply = agent_socket.query(proc.pid)
        assert reply["pid"] == proc.pid and reply["cuda"] is False and reply["devices"] == []
    finally:
        stop(proc)
    assert not path.exists()  # gone with the process


def test_only_stats_is_answered_and_nothing_is_executed(runtime, tmp_path):
    proc = start()
    marker = tmp_path / "pwned"
    try:
        for request in (f"__import__('os').system('touch {marker}')\n".encode(), b"", b"x" * 10000,
                        b"stats; rm -rf /\n"):
            answer = raw(proc.pid, request)
            if answer:
                assert "error" in json.loads(answer)
        assert not marker.exists()
        assert agent_socket.query(proc.pid)["pid"] == proc.pid  # still serving
        assert proc.poll() is None  # and the program runs on
    finally:
        stop(proc)


def test_a_forked_child_leaves_the_parents_socket(runtime):
    proc = start("fork")
    try:
        assert agent_socket.query(proc.pid)["pid"] == proc.pid
    finally:
        stop(proc)


def test_a_folder_open_to_others_gets_no_socket(runtime):
    folder = runtime / f"gpumemdoctor-{os.getuid()}"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    assert agent_socket.private_dir() is None
    proc = start()
    try:
        assert not Path(agent_socket.socket_path(proc.pid)).exists()
        assert agent_socket.query(proc.pid) is None
    finally:
        stop(proc)


def test_a_link_in_place_of_the_folder_is_refused(runtime, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (runtime / f"gpumemdoctor-{os.getuid()}").symlink_to(elsewhere)
    assert agent_socket.private_dir() is None


def test_no_socket_when_switched_off(runtime, monkeypatch):
    monkeypatch.setenv("GPUMEMDOCTOR_SOCKET", "0")
    env = {**os.environ}
    proc = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert not Path(agent_socket.socket_path(proc.pid)).exists()
    finally:
        stop(proc)


def test_watch_shows_that_the_agent_answered(cli, runtime, tmp_path):
    proc = start()
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU",
                                           "total": 1 << 36, "used": 1 << 30, "reserved": 0,
                                           "processes": [{"pid": proc.pid, "used": 1 << 30}]}]}))
    try:
        result = cli("watch", "--pid", str(proc.pid), "--interval", "0.05", "--duration", "0.3", "--no-tui",
                     "--jsonl", "w.jsonl", cwd=tmp_path,
                     env={"PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent / "doubles"),
                                                         os.environ.get("PYTHONPATH")])),
                          "GPUMEMDOCTOR_TEST_NVML": str(state), "XDG_RUNTIME_DIR": str(runtime)})
    finally:
        stop(proc)
    assert result.returncode == 0, result.stderr
    line = json.loads((tmp_path / "w.jsonl").read_text().splitlines()[0])
    assert str(proc.pid) in line["torch"]  # the agent answered (no CUDA in it, so no devices)
