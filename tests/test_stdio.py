"""The tool's own standard streams (issue 41): standard output as a file to write (`--html /dev/stdout`),
standard output or error that cannot be written (a full disk, closed, an encoding without the report's
characters), and Ctrl-C before the command has started. Each runs the real CLI in a subprocess: what is
tested is the process's streams and its exit status."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CLI, cli_env

FIXTURES = Path(__file__).parent / "fixtures"
LEAK = FIXTURES / "reports" / "leak_training_list.json"


def run_with(args: list[str], cwd: Path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env: dict | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """`gpumemdoctor ARGS` with standard output and error as given (a pipe, a file, /dev/full)."""
    return subprocess.run([*CLI, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                          env=cli_env(env), timeout=timeout)


# -- cause 2: /dev/stdout is written in place, also when it is a pipe ------------------------------------

def test_an_html_page_to_dev_stdout_goes_down_a_pipe(tmp_path):
    pytest.importorskip("plotly")
    result = run_with(["report", str(LEAK), "--html", "/dev/stdout", "--force"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = result.stdout.decode()
    assert page.lstrip().lower().startswith("<!doctype html") and page.rstrip().endswith("</html>")
    # the line that names the page goes to standard error, not after the page's end
    assert result.stderr.decode().startswith("HTML report: /dev/stdout (")


def test_a_run_report_to_dev_stdout_goes_down_a_pipe(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    result = run_with(["run", "--allow-no-gpu", "-q", "-o", "/dev/stdout", "--force", "t.py"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["schema"] == "gpumemdoctor.report/1"


# -- cause 1: standard output that cannot be written is one line and exit 2, never 70 -------------------

def _close_stdout() -> None:
    os.close(1)  # as `>&-` leaves it


@pytest.mark.parametrize("how", ["full", "closed"])
@pytest.mark.parametrize("args", [["report", str(LEAK)], ["compare", str(LEAK), str(LEAK)], ["--help"], ["--version"]],
                         ids=["report", "compare", "help", "version"])
def test_standard_output_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, how, args):
    with open("/dev/full", "wb") as full:
        result = subprocess.run([*CLI, *args], cwd=tmp_path, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=cli_env(), timeout=120, stdout=full if how == "full" else None,
                                preexec_fn=_close_stdout if how == "closed" else None)
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert err.splitlines() == [err.strip()] and err.startswith("gpumemdoctor: error: cannot write to standard "
                                                                "output: "), err
    assert ("No space left" if how == "full" else "closed") in err


def test_an_encoding_without_the_reports_characters_degrades(tmp_path):
    result = run_with(["report", str(LEAK), "--width", "80"], cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode("ascii")  # nothing but ASCII came
    assert out.startswith("gpumemdoctor verdict: leak") and "?" in out  # the timeline's blocks, replaced
    assert result.stderr == b""


# -- cause 8: standard error that cannot be written leaves the target's exit status --------------------

@pytest.mark.parametrize("status", [0, 3])
@pytest.mark.parametrize("how", ["full", "closed"])
def test_the_targets_exit_status_survives_an_unwritable_standard_error(tmp_path, status, how):
    (tmp_path / "t.py").write_text(f"print('ran')\nraise SystemExit({status})\n")
    with open("/dev/full", "wb") as full:
        result = subprocess.run([*CLI, "run", "--allow-no-gpu", "-o", "r.json", "t.py"], cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=cli_env(), timeout=120,
                                stderr=full if how == "full" else None,
                                preexec_fn=(lambda: os.close(2)) if how == "closed" else None)
    assert result.returncode == status
    assert result.stdout == b"ran\n"
    assert json.loads((tmp_path / "r.json").read_text())["recording"]["target"]["exit_code"] == status


# -- cause 9: Ctrl-C while the command line's modules load ---------------------------------------------

INTERRUPTED_IMPORT = """
import os, runpy, signal, sys

class CtrlC:
    # Ctrl-C arrives while {module} is being imported, as it did in the first ~50 ms
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["gpumemdoctor", "report", "r.json"]
runpy.run_module("gpumemdoctor", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["click", "gpumemdoctor.cli._stdio"])
def test_ctrl_c_while_the_modules_load_is_the_aborted_line(tmp_path, module):
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT.format(module=module)], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, env=cli_env(), timeout=60)
    assert result.returncode == 130, result.stderr
    assert result.stderr == "gpumemdoctor: error: aborted\n"


def test_ctrl_c_while_a_subcommand_loads_is_the_aborted_line_of_a_running_command(tmp_path):
    """A subcommand's module loads when it runs, inside main(): a Ctrl-C then ends it as one that comes
    while the command runs (click starts a new line first, after the terminal's ^C)."""
    code = INTERRUPTED_IMPORT.format(module="gpumemdoctor.cli.report")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, env=cli_env(), timeout=60)
    assert result.returncode == 130, result.stderr
    assert result.stderr == "\ngpumemdoctor: error: aborted\n"
    assert "gpumemdoctor.cli.report" not in subprocess.run(
        [sys.executable, "-c", "import sys, gpumemdoctor.cli; print(sorted(sys.modules))"], cwd=tmp_path,
        capture_output=True, text=True, env=cli_env(), timeout=60).stdout


def test_a_sigint_the_caller_ignores_stays_ignored(tmp_path):
    """A background job's SIGINT is ignored (SIG_IGN): loading the command line does not start heeding it."""
    code = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import gpumemdoctor.cli; "
            "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env=cli_env(), timeout=60)
    assert result.returncode == 0, result.stderr
