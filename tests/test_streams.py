"""The tool's own standard streams (issue 41): standard output as a file to write (`--html /dev/stdout`),
standard output or error that cannot be written (a full disk, closed, an encoding without the report's
characters), and Ctrl-C before the command has started. Each runs the real CLI in a subprocess: what is
tested is the process's streams and its exit status."""
from __future__ import annotations

import json
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
