"""`gpumemdoctor run` of a command on PATH (torchrun, a console script) and of a launcher with ranks."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from gpumemdoctor.cli._target import _python_of, _same_python
from gpumemdoctor.cli.run import _split, run_command


def test_options_after_the_target_are_the_targets():
    ours, target = _split(["-q", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-o", "x",
                           "train.py", "--force"], run_command)
    assert ours == ["-q"]
    assert target == ["-m", "torch.distributed.run", "--nproc-per-node", "2", "-o", "x", "train.py", "--force"]
    ours, target = _split(["--force", "-o", "r.json", "torchrun", "--nproc-per-node", "2", "-q", "train.py"],
                          run_command)
    assert ours == ["--force", "-o", "r.json"] and target == ["torchrun", "--nproc-per-node", "2", "-q", "train.py"]


def test_the_python_a_script_names(tmp_path):
    assert _python_of(b"#!/venv/bin/python3\nimport sys\n") == "/venv/bin/python3"
    assert _python_of(b"#!/opt/py/bin/python3.11 -u\n") == "/opt/py/bin/python3.11"
    # pip's console script for an interpreter whose path is too long for #!
    assert _python_of(b"#!/bin/sh\n'''exec' \"/a/very/long/path/bin/python\" \"$0\" \"$@\"\n' '''\n"
                      b"import sys\n") == "/a/very/long/path/bin/python"
    env = _python_of(b"#!/usr/bin/env -S python3 -u\n")
    assert env is not None and os.path.basename(env) == "python3"
    for not_python in (b"#!/bin/sh\necho hi\n", b"#!/usr/bin/env bash\n", b"\x7fELF\x02\x01\x01\0\0",
                       b"import sys\n", b"#!/usr/bin/env\n", b""):
        assert _python_of(not_python) is None, not_python
    other = tmp_path / "bin" / "python3"
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    assert _same_python(sys.executable, sys.executable)
    for sibling in ("python", "python3"):  # a venv's torchrun names bin/python3, gpumemdoctor bin/python
        path = os.path.join(os.path.dirname(sys.executable), sibling)
        if os.path.exists(path):
            assert _same_python(path, sys.executable)
    # a link to the same file in another folder is another environment (a virtual environment's)
    assert not _same_python(str(other), sys.executable)
    assert not _same_python("/no/such/python", sys.executable)


# A console script as pip writes it, for a package of the test's own.
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {package}.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
CLI_MODULE = """
import json, os, sys
def main():
    print(json.dumps({"argv": sys.argv, "executable": sys.executable,
                      "agent": "GPUMEMDOCTOR_RUN_DIR" in os.environ, "pid": os.getpid()}))
    return 3
"""


def _tool(tmp_path: Path, name: str, python: str, package: str = "fakepkg") -> dict:
    """Write the console script `name` into a folder put first on PATH; its package on PYTHONPATH."""
    bin_dir, lib = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir(exist_ok=True)
    (lib / "fakepkg").mkdir(parents=True, exist_ok=True)
    (lib / "fakepkg" / "__init__.py").write_text("")
    (lib / "fakepkg" / "cli.py").write_text(CLI_MODULE)
    script = bin_dir / name
    script.write_text(CONSOLE_SCRIPT.format(python=python, package=package))
    script.chmod(0o755)
    pythonpath = os.pathsep.join(filter(None, [str(lib), os.environ.get("PYTHONPATH")]))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": pythonpath}


def test_a_console_script_on_path_runs_as_its_script(cli, tmp_path):
    env = _tool(tmp_path, "mytool", sys.executable)
    result = cli("run", "--allow-no-gpu", "-q", "mytool", "--nproc-per-node", "2", "-q", "x.py",
                 cwd=tmp_path, env=env)
    assert result.returncode == 3, result.stderr  # the target's own status
    ran = json.loads(result.stdout)
    assert ran["argv"] == [str(tmp_path / "bin" / "mytool"), "--nproc-per-node", "2", "-q", "x.py"]
    assert ran["executable"] == sys.executable and ran["agent"]
    assert "note" not in result.stderr and "error" not in result.stderr
    report = tmp_path / f"gpumemdoctor-mytool.{ran['pid']}.json"
    recording = json.loads(report.read_text())["recording"]
    assert recording["target"]["argv"][0] == str(tmp_path / "bin" / "mytool")
    assert [a["pid"] for a in recording["agents"]] == [ran["pid"]]


def test_a_script_for_another_python_runs_under_ours_with_a_note(cli, tmp_path):
    other = tmp_path / "other" / "python3"
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    env = _tool(tmp_path, "mytool", str(other))
    result = cli("run", "--allow-no-gpu", "-q", "-o", "r.json", "mytool", "a", cwd=tmp_path, env=env)
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["executable"] == sys.executable
    notes = [line for line in result.stderr.splitlines() if line.startswith("gpumemdoctor: note:")]
    assert notes == [f"gpumemdoctor: note: mytool's #! line names {other}; it runs under "
                     f"{sys.executable}, the Python gpumemdoctor runs in"]


def test_a_script_for_another_python_that_ours_cannot_run_is_refused(cli, tmp_path):
    other = tmp_path / "other" / "python3"
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    env = _tool(tmp_path, "mytool", str(other), package="no_such_package_here")
    result = cli("run", "--allow-no-gpu", "mytool", cwd=tmp_path, env=env)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"gpumemdoctor: error: mytool is a script for {other} (its #! line)")
    assert "cannot import 'no_such_package_here'" in line and f"{other} -m pip install gpumemdoctor" in line


def test_a_command_on_path_that_is_not_python_is_refused(cli, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tool.sh").write_text("#!/bin/sh\necho ran\n")
    (bin_dir / "tool.sh").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    shell = cli("run", "--allow-no-gpu", "tool.sh", cwd=tmp_path, env=env)
    assert shell.returncode == 2 and shell.stdout == ""
    assert shell.stderr.splitlines() == [f"gpumemdoctor: error: tool.sh ({bin_dir / 'tool.sh'}) is not a "
                                         "Python script; gpumemdoctor runs Python programs: give a "
                                         "Python script, or a module with -m"]
    python = cli("run", "--allow-no-gpu", "python3", "train.py", cwd=tmp_path, env=env)
    assert python.returncode == 2 and "python3 is Python itself" in python.stderr
    assert len(python.stderr.splitlines()) == 1
    missing = cli("run", "--allow-no-gpu", "no-such-command-here", cwd=tmp_path, env=env)
    assert missing.returncode == 2 and missing.stderr == (
        "gpumemdoctor: error: no-such-command-here: no such file, nor a command on PATH: give a Python "
        "script, a module with -m, or a Python console script on PATH (torchrun)\n")


RANK_SCRIPT = """
import json, os
print(json.dumps({k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
                 | {"pid": os.getpid(), "ppid": os.getppid(), "agent": "GPUMEMDOCTOR_RUN_DIR" in os.environ}),
      flush=True)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (a CPU build will do)")
def test_torch_distributed_run_under_run_records_the_launcher_and_each_rank(cli, tmp_path):
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    result = cli("run", "--allow-no-gpu", "-q", "-o", "r.json", "-m", "torch.distributed.run",
                 "--nproc-per-node", "2", "rank.py", cwd=tmp_path, timeout=180,
                 env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    # The two ranks write to one pipe: one's line may land in the middle of the other's.
    ranks = sorted((json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", result.stdout)),
                   key=lambda r: r["RANK"])
    recording = json.loads((tmp_path / "r.json").read_text())["recording"]
    launcher = recording["target"]["pid"]
    assert recording["target"]["argv"] == ["-m", "torch.distributed.run", "--nproc-per-node", "2", "rank.py"]
    # each rank saw torchrun's variables, and the agent's
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "0", "2"), ("1", "1", "2")]
    assert all(r["agent"] and r["ppid"] == launcher and r["TORCHELASTIC_RUN_ID"] for r in ranks)
    # an agent in the launcher and in each rank
    agents = {a["pid"]: a for a in recording["agents"]}
    assert set(agents) == {launcher, *(r["pid"] for r in ranks)}
    assert all(agents[r["pid"]]["ppid"] == launcher and agents[r["pid"]]["argv"] == ["rank.py"] for r in ranks)


GLOO_JOB = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (a CPU build will do)")
def test_two_nodes_reports_of_a_gloo_job_are_one_job_in_report(cli, tmp_path):
    """Multi-node by report files (issue 29): a job of two nodes of two ranks each, on the CPU (gloo),
    one `gpumemdoctor run` per node; their two reports are one job of four ranks, and one alone says
    which ranks it lacks. (The same on two GPUs: tests/gpu/test_ranks.py.)"""
    import socket
    import threading

    (tmp_path / "job.py").write_text(GLOO_JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = {}

    def node(n: int) -> None:
        results[n] = cli("run", "--allow-no-gpu", "-q", "-o", f"node{n}.json", "-m", "torch.distributed.run",
                         "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "2", "--master-addr",
                         "127.0.0.1", "--master-port", str(port), "job.py", cwd=tmp_path, timeout=240,
                         env={"OMP_NUM_THREADS": "1"})

    threads = [threading.Thread(target=node, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in (0, 1):
        assert results[n].returncode == 0, results[n].stderr
    one = cli("report", "node0.json", "node1.json", "--width", "120", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert re.search(r"^Ranks\s+4 ranks on 1 host \(", one.stdout, re.M), one.stdout
    rows = re.findall(r"^\s+(\d)\s+(\d)\s+\S+\s+(\d+)\s+-\s", one.stdout, re.M)
    assert [(r, local) for r, local, _ in rows] == [("0", "0"), ("1", "1"), ("2", "0"), ("3", "1")]
    reports = [json.loads((tmp_path / f"node{n}.json").read_text()) for n in (0, 1)]
    pids = {a["dist"]["rank"]: a["pid"] for r in reports for a in r["recording"]["agents"] if a.get("dist")
            and a["pid"] != r["recording"]["target"]["pid"]}
    assert {int(r): int(pid) for r, _, pid in rows} == pids
    alone = cli("report", "node0.json", "--width", "120", cwd=tmp_path)
    assert "world size 4, but ranks 2-3 are not in this report" in " ".join(alone.stdout.split())
