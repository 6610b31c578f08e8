"""The rough edges that a sweep of 762 bad inputs found (issue 61), each through the real command line in a
subprocess: reports whose nested fields have the wrong type or an impossible value, output paths that
name a folder, `run -m` of a folder Python cannot run, a script whose name begins with a dash, a reader
that stops early on an output that is a pipe, and the words of `report` and `compare`.

The field-by-field strictness of the report's declarations is tests/test_schema.py's.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CLI, cli_env

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = FIXTURES / "reports" / "cache_after_matmul.json"  # a small report recorded on an H100
CLEAN = FIXTURES / "reports" / "clean_adam.json"
H100 = FIXTURES / "caught" / "oom_eval_without_no_grad_local.json"  # one program, on an H100 ...
H200 = FIXTURES / "caught" / "oom_eval_without_no_grad_local_h200.json"  # ... and on an H200


def run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=cli_env(env), stdin=subprocess.DEVNULL)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumemdoctor: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A target that leaves a file `ran` behind if it runs."""
    (tmp_path / "t.py").write_text("open('ran', 'w').close()\nprint('target ran')\n")
    return tmp_path / "t.py"


# -- 1. a report's nested fields, read strictly --------------------------------------------------

def _set(doc: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


# The seven the sweep found: each was drawn, exit 0. `target`, `devices` and `timeline` are the copies of
# the recording's figures that a report carries for its readers (docs/json.md).
DAMAGED = [
    (("target", "pid"), "4242", "report target pid"),
    (("target", "argv"), "python train.py", "report target argv"),
    (("target", "pid"), 2 ** 70, "report target pid"),
    (("target", "duration_s"), 1e19, "report target duration_s"),
    (("devices",), {"index": 0}, "report devices"),
    (("timeline",), "none", "report timeline"),
    (("timeline", 0, "t"), 1e308, "report timeline t"),
    # and the same in the recording, which the reporters draw
    (("recording", "target", "pid"), 2 ** 70, "recording target pid"),
    (("recording", "duration_s"), 1e19, "recording duration_s"),
    (("recording", "agents", 0, "samples", 0, "t"), 1e308, "recording agents samples t"),
]


@pytest.mark.parametrize("path, value, field", DAMAGED, ids=["/".join(map(str, p)) for p, _, _ in DAMAGED])
def test_a_report_with_a_field_of_the_wrong_type_or_an_impossible_value_is_refused(tmp_path, path, value, field):
    doc = json.loads(SMALL.read_text())
    _set(doc, path, value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    for args in (["report", str(bad)], ["compare", str(SMALL), str(bad)], ["report", str(bad), "--html", "p.html"]):
        result = run(*args, cwd=tmp_path)
        assert result.returncode == 4, result.stderr
        line = one_error_line(result)
        assert f"{bad} is not a valid report: {field}:" in line, line
        assert result.stdout == ""
    assert not (tmp_path / "p.html").exists()


# -- 2. an output path that names a folder ------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["run", "--allow-no-gpu", "-o", "x.json/", "t.py"],
    ["run", "--allow-no-gpu", "-o", "x.json/.", "t.py"],
    ["run", "--allow-no-gpu", "--html", "x.json/", "t.py"],
    ["run", "--allow-no-gpu", "--snapshot", "x.json/", "t.py"],
    ["run", "--allow-no-gpu", "--max-peak", "1GiB", "--junit", "x.json/", "t.py"],
    ["run", "--allow-no-gpu", "--update-baseline", "--baseline", "x.json/", "t.py"],
    ["compare", str(CLEAN), str(CLEAN), "--junit", "x.json/"],
    ["report", str(CLEAN), "--html", "x.json/"],
    ["report", "--from-run-dir", ".", "-o", "x.json/"],
    ["watch", "--pid", str(os.getpid()), "--jsonl", "x.json/"],
], ids=lambda a: " ".join(a[:1] + [x for x in a[1:] if x.startswith("-") and x != "--allow-no-gpu"]))
def test_an_output_path_that_names_a_folder_is_refused_before_anything_runs(tmp_path, target, args):
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "names a directory (it ends in /" in one_error_line(result)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "x.json").exists()
    assert not list(tmp_path.glob("gpumemdoctor-*.json"))


def test_an_output_path_that_names_a_folder_is_refused_where_a_file_of_that_name_is_there(tmp_path, target):
    (tmp_path / "x.json").write_text("mine\n")
    result = run("run", "--allow-no-gpu", "--force", "-o", "x.json/", "t.py", cwd=tmp_path)
    assert result.returncode == 2 and "names a directory" in one_error_line(result)
    assert (tmp_path / "x.json").read_text() == "mine\n" and not (tmp_path / "ran").exists()


# -- 3. run -m of a folder that python -m cannot run -------------------------------------------

@pytest.mark.parametrize("module, made", [
    ("emptydir", ["emptydir/"]),  # a namespace package: no __init__.py, no __main__.py
    ("pkg", ["pkg/__init__.py"]),  # a package without __main__.py
    ("ns.inner", ["ns/inner/"]),
])
def test_run_m_of_a_package_without_main_is_refused_in_pythons_words(tmp_path, module, made):
    for name in made:
        if name.endswith("/"):
            (tmp_path / name).mkdir(parents=True)
        else:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("open('ran', 'w').close()\n")
    result = run("run", "--allow-no-gpu", "-m", module, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert f"no module named {module}.__main__; {module!r} is a package and cannot be directly executed" in line
    assert not (tmp_path / "ran").exists() and not list(tmp_path.glob("gpumemdoctor-*.json"))
    python = subprocess.run([sys.executable, "-m", module], cwd=tmp_path, capture_output=True, text=True)
    assert f"No module named {module}.__main__; {module!r} is a package" in python.stderr  # Python's own words


def test_run_m_of_a_package_with_main_runs(tmp_path):
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "emptydir" / "__main__.py").write_text("import sys\nprint('main ran', sys.argv[1:])\n")
    result = run("run", "--allow-no-gpu", "-q", "-o", "r.json", "-m", "emptydir", "a", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "main ran ['a']\n"


# -- 4. a script whose name begins with a dash ---------------------------------------------------

@pytest.mark.parametrize("name, argv0, shown", [
    ("-dash.py", "-dash.py", "python -- -dash.py"),
    ("--twice.py", "--twice.py", "python -- --twice.py"),
    ("-", "./-", "python ./-"),  # python reads `-` from standard input, even after --
])
def test_a_script_whose_name_begins_with_a_dash_is_run_as_the_script(tmp_path, name, argv0, shown):
    (tmp_path / name).write_text("import sys\nprint('argv', sys.argv)\n")
    result = run("run", "--allow-no-gpu", "-o", "r.json", "--", name, "-x", "--", "y", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"argv {[argv0, '-x', '--', 'y']!r}\n"
    assert f"Target   {shown} -x -- y" in result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["target"]["argv"] == [name, "-x", "--", "y"] and report["target"]["exit_code"] == 0


# -- 5. a reader that stops early -----------------------------------------------------------------

def _head(args: list[str], cwd: Path, count: int = 100) -> tuple[int, bytes, str]:
    """`gpumemdoctor ARGS | head -c COUNT`: the command's exit status, what head read, its stderr."""
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=cli_env())
    read = proc.stdout.read(count)
    proc.stdout.close()  # as head does once it has its bytes
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), read, err


@pytest.mark.parametrize("args, code, starts", [
    (["report", str(CLEAN), "--html", "/dev/stdout", "--force"], 0, b"<!DOCTYPE html>"),
    (["compare", str(CLEAN), str(FIXTURES / "reports" / "leak_training_list.json"), "--junit", "/dev/stdout"], 10,
     b"figure"),
    (["run", "--allow-no-gpu", "-q", "-o", "/dev/stdout", "--force", "big.py"], 0, b"x" * 10),
    (["run", "--allow-no-gpu", "-q", "-o", "r.json", "--html", "/dev/stdout", "--force", "big.py"], 0, b"x" * 10),
])
def test_a_reader_that_stops_early_on_an_output_that_is_standard_output_is_no_error(tmp_path, args, code, starts):
    pytest.importorskip("plotly")
    (tmp_path / "big.py").write_text("print('x' * 50)\n")
    status, read, err = _head(args, tmp_path)
    assert status == code, err
    assert read.startswith(starts), read
    assert "error" not in err and "Broken pipe" not in err and "Traceback" not in err, err


# -- 6. the words of report and compare, and the README ------------------------------------------

def test_report_without_a_file_says_that_neither_was_given(tmp_path):
    line = one_error_line(run("report", cwd=tmp_path))
    assert "neither a report file nor --from-run-dir was given" in line and "not both" not in line
    both = one_error_line(run("report", str(CLEAN), "--from-run-dir", ".", cwd=tmp_path))
    assert "not both" in both


def test_compare_of_two_gpu_models_says_so_in_the_terminal_the_junit_file_and_the_step_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("")
    result = run("compare", str(H100), str(H200), "--junit", "j.xml", cwd=tmp_path,
                 env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 10, result.stderr  # the H200's larger memory held more: a failed check
    said = ("the two reports were made on different GPUs (old: NVIDIA H100 80GB HBM3; new: NVIDIA H200)")
    assert said in " ".join(result.stdout.split())
    assert "not by itself a change in the code" in " ".join(result.stdout.split())
    junit = (tmp_path / "j.xml").read_text()
    assert re.search(r"<system-out>note: the two reports were made on different GPUs", junit)
    assert f"Note: {said}" in summary.read_text()
    assert "different programs" not in result.stdout and "different arguments" not in result.stdout


def test_compare_of_two_programs_says_so(tmp_path):
    result = run("compare", str(CLEAN), str(FIXTURES / "reports" / "leak_training_list.json"), "--junit", "j.xml",
                 cwd=tmp_path)
    text = " ".join(result.stdout.split())
    assert "the two reports are of different programs (old: python /work/main/scenarios/clean_adam.py; new: " \
           "python /work/main/scenarios/leak_training_list.py)" in text
    assert "different programs" in (tmp_path / "j.xml").read_text()
    assert "different GPUs" not in text


def test_compare_of_one_program_on_one_gpu_model_has_no_note(tmp_path):
    result = run("compare", str(CLEAN), str(CLEAN), "--junit", "j.xml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "note:" not in result.stdout and "system-out" not in (tmp_path / "j.xml").read_text()


def test_the_readme_names_allow_no_gpu_where_exit_3_is_met():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    install = readme[readme.index("## Install"):readme.index("## Three commands")]
    assert "exit 3" in install and "--allow-no-gpu" in install
