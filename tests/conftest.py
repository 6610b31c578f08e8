"""Shared helpers: run the real CLI in a subprocess, and write small target scripts."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

CLI = [sys.executable, "-m", "gpumemdoctor"]


# A launcher's variables name the rank of a process (the agent reads them) and change the default
# report's name: tests that run under torchrun, srun or mpirun must not inherit them.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "TORCHELASTIC_")
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def cli_env(extra: dict | None = None) -> dict:
    """The test process's environment without any gpumemdoctor run or launcher of its own, plus
    `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMEMDOCTOR_", *LAUNCHER_PREFIXES))
           and k not in LAUNCHER_VARIABLES}
    env["NO_COLOR"] = "1"
    env.update(extra or {})
    return env


def run_cli(*args: str, cwd, input: str | None = None, timeout: float = 60,
            env: dict | None = None, python_flags: tuple = ()) -> subprocess.CompletedProcess:
    """`python [python_flags] -m gpumemdoctor ARGS...` in cwd; text output captured.

    Without `input`, stdin is /dev/null so that a target reading it never waits on the
    terminal that runs the tests.
    """
    kwargs = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run([sys.executable, *python_flags, "-m", "gpumemdoctor", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=cli_env(env), **kwargs)


def invoke(*args: str) -> tuple[int, str, str]:
    """`gpumemdoctor ARGS...` in this process, through `cli.main` as the console script calls it:
    its exit code, standard output and standard error. Much quicker than a subprocess."""
    from gpumemdoctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def write_script(folder: Path, name: str, text: str) -> Path:
    """Write a dedented script into folder and return its path."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.fixture(name="cli", scope="session")
def cli_fixture():
    """run_cli as a fixture, so test modules need not import conftest."""
    return run_cli


@pytest.fixture(name="script", scope="session")
def script_fixture():
    """write_script as a fixture."""
    return write_script


@pytest.fixture(name="cli_env", scope="session")
def cli_env_fixture():
    """cli_env as a fixture: the environment the CLI helpers give their subprocesses."""
    return cli_env


def start_cli(*args: str, cwd, env: dict | None = None, stderr=subprocess.PIPE) -> subprocess.Popen:
    """Start `python -m gpumemdoctor ARGS...` without waiting: stdout a binary pipe, stdin /dev/null.

    It gets a session of its own, so it has no controlling terminal (as in CI) and a
    signal sent to it is the only one it, or its target, receives.
    """
    return subprocess.Popen([*CLI, *args], cwd=cwd, env=cli_env(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)


@pytest.fixture(name="popen_cli")
def popen_cli_fixture():
    """start_cli as a fixture; every process it started is killed (by its pid) at teardown."""
    started: list[subprocess.Popen] = []

    def start(*args: str, **kwargs) -> subprocess.Popen:
        proc = start_cli(*args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:  # a test failed midway: end the target, then the tool
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                try:
                    child.kill()
                except psutil.Error:
                    pass
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr not in (None, subprocess.PIPE) and hasattr(proc.stderr, "close"):
            proc.stderr.close()


@pytest.fixture
def sleeper():
    """A process that sleeps for a minute: something for `watch --pid` to watch."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def _fresh_fork_estimate():
    """Each test's agent stands for a process of its own: the forks of earlier tests in this worker
    (loaded by the others) do not calibrate its pause estimate (forked.calibrate)."""
    forked = sys.modules.get("gpumemdoctor._agent.search.forked")
    if forked is not None:
        forked._measured.clear()
    yield
