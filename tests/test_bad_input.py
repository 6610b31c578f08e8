"""Bad input and the exit-code contract (issue 20): each input that crashed, hung, passed silently or
clobbered a file gets the one line and the exit code that docs/cli.md promises.

Most of these call the command line in this process (`cli.main`, as the console script does), which
is quick; those whose target must run, or that need a real pipe or a hang's time limit, run it in a
subprocess. No GPU is needed: `--allow-no-gpu`, hand-built reports and the reports in
tests/fixtures.
"""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpumemdoctor.diagnosis import ci_checks as checks
from gpumemdoctor.app import baseline_file
from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.recording.recording import ProcessRecord, Recording
from gpumemdoctor.app.report_file import build

from .conftest import cli_env, invoke
from .test_report_parse import make_recording

FIXTURES = Path(__file__).parent / "fixtures"
LONG = FIXTURES / "long" / "h100_slow_leak_7min.json"
CLEAN = FIXTURES / "reports" / "clean_adam.json"


# -- helpers --------------------------------------------------------------------------------

def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumemdoctor: error: "), err
    assert "Traceback" not in err
    return lines[0]


def leak_report() -> dict:
    """A small valid report (the hand-built leak of test_report_parse)."""
    recording = make_recording()
    return build(recording, diagnose(recording))


def no_gpu_report(pid: int = 4242) -> dict:
    """A report of a run without a GPU, as `run --allow-no-gpu` writes one."""
    recording = Recording(tool_version="0.1.0",
                          target={"argv": ["t.py"], "pid": pid, "exit_code": 0, "signal": None, "cwd": "/x"},
                          started_wall=1.7e9, duration_s=0.5, poll_interval_s=0.005, nvml_available=False,
                          versions={"tool": "0.1.0"},
                          processes=[ProcessRecord(pid=pid, ppid=1, cmdline=["python", "t.py"], create_time=1.0,
                                                   is_target=True, first_seen_t=0.0)])
    return build(recording, diagnose(recording))


def dump(path: Path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def run_cli(*args: str, cwd: Path, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpumemdoctor", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=cli_env(env), stdin=subprocess.DEVNULL)


@pytest.fixture
def target(tmp_path: Path, monkeypatch) -> Path:
    """A target that says it ran by leaving a file behind, in tmp_path (the current folder here)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("open('ran', 'w').close()\nprint('target ran')\n")
    return tmp_path / "t.py"


# -- the bad-input table ------------------------------------------------------------------------
# One row per bad input: the command line, its exit code, and the words its one-line error must hold.
# The next sweep of bad inputs adds rows here. In a command line, {pid} is a live process, {report} a
# valid report (a file that is not a watch log), {baseline} a valid baseline and t.py a target that
# leaves a file `ran` behind if it runs: none may run. A row that starts with "pytest" runs pytest, with
# the plugin, in an empty folder.
BAD_INPUT = [
    # issue 28, row 3: an unset $BASELINE in CI
    (["run", "--allow-no-gpu", "--baseline", "", "t.py"], 2, ["--baseline", "an empty file name"]),
    # row 4: a file that is not a watch log, not appended to
    (["watch", "--pid", "{pid}", "--jsonl", "{report}"], 2, ["r.json", "not a log of gpumemdoctor watch",
                                                            "--force"]),
    # row 5: a baseline of nulls (no NVML: nothing can be measured)
    (["run", "--allow-no-gpu", "--update-baseline", "--baseline", "b.json", "t.py"], 2,
     ["--update-baseline", "nothing", "measured"]),
    # row 6: a tolerance with nothing to compare
    (["run", "--allow-no-gpu", "--tolerance", "10%", "t.py"], 2, ["--tolerance", "--baseline"]),
    (["run", "--allow-no-gpu", "--nvml-tolerance", "64MiB", "t.py"], 2, ["--nvml-tolerance", "--baseline"]),
    # row 7: an empty file name
    (["run", "--allow-no-gpu", "-o", "", "t.py"], 2, ["-o", "an empty file name"]),
    (["run", "--allow-no-gpu", "--html", "", "t.py"], 2, ["--html", "an empty file name"]),
    (["run", "--allow-no-gpu", "--snapshot", "", "t.py"], 2, ["--snapshot", "an empty file name"]),
    (["run", "--allow-no-gpu", "--junit", "", "--max-peak", "1GiB", "t.py"], 2, ["--junit", "an empty file name"]),
    (["report", "{report}", "--html", ""], 2, ["--html", "an empty file name"]),
    (["compare", "{report}", "{report}", "--junit", ""], 2, ["--junit", "an empty file name"]),
    (["watch", "--pid", "{pid}", "--jsonl", ""], 2, ["--jsonl", "an empty file name"]),
    # row 8: negative values, refused as negative
    (["compare", "{report}", "{report}", "--tolerance", "-5%"], 2, ["-5%", "must not be negative"]),
    (["compare", "{report}", "{report}", "--nvml-tolerance", "-64MiB"], 2, ["-64MiB", "must not be negative"]),
    (["watch", "--pid", "{pid}", "--max-growth", "-1MiB/s"], 2, ["-1MiB/s", "must not be negative"]),
    (["watch", "--pid", "{pid}", "--max-vram", "-1MiB"], 2, ["-1MiB", "must not be negative"]),
    (["run", "--allow-no-gpu", "--max-peak", "-1GiB", "t.py"], 2, ["-1GiB", "must not be negative"]),
    (["ps", "--expect-free", "-1GiB"], 2, ["-1GiB", "must not be negative"]),
    (["pytest", "--vram-check", "--vram-threshold=-1MiB"], 4, ["--vram-threshold", "-1MiB", "must not be negative"]),
    # issue 41, cause 3: an empty --nvml-tolerance silently dropped the NVML check
    (["compare", "{report}", "{report}", "--nvml-tolerance", ""], 2, ["--nvml-tolerance", "an empty tolerance"]),
    (["compare", "{report}", "{report}", "--tolerance", " "], 2, ["--tolerance", "an empty tolerance"]),
    (["run", "--allow-no-gpu", "--baseline", "{baseline}", "--nvml-tolerance", "", "t.py"], 2,
     ["--nvml-tolerance", "an empty tolerance"]),
    # cause 6: an empty script name was ": no such file"
    (["run", "--allow-no-gpu", ""], 2, ["an empty script name", "variable unset"]),
    # cause 7: a missing submodule ran the target (Python said it, exit 1, and a report was written)
    (["run", "--allow-no-gpu", "-m", "json.nope"], 2, ["no module named 'json.nope'", "json has no module 'nope'"]),
    (["run", "--allow-no-gpu", "-m", "email.mime.nope.deeper"], 2, ["'email.mime.nope'"]),
    (["run", "--allow-no-gpu", "-m", "string.nope"], 2, ["'string.nope'", "string is a module, not a package"]),
]


@pytest.mark.parametrize("args, code, words", BAD_INPUT, ids=[" ".join(a) or "''" for a, _, _ in BAD_INPUT])
def test_bad_input(tmp_path, target, args, code, words):
    report = dump(tmp_path / "r.json", leak_report())
    recording = make_recording()
    baseline = dump(tmp_path / "b.json", checks.baseline_document(recording, diagnose(recording)))
    args = [a.replace("{pid}", str(os.getpid())).replace("{report}", report).replace("{baseline}", baseline)
            for a in args]
    if args[0] == "pytest":
        empty = tmp_path / "empty"
        empty.mkdir()
        result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args[1:]], cwd=empty,
                                capture_output=True, text=True, timeout=120, env=cli_env(),
                                stdin=subprocess.DEVNULL)
        got, err = result.returncode, result.stderr
        assert "Traceback" not in err
        line = next((s for s in err.splitlines() if "--vram-threshold" in s), err)
    else:
        got, _, err = invoke(*args)
        line = one_line(err)
    assert got == code, err
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "ran").exists()


def test_a_submodule_is_looked_for_without_running_its_packages_code(tmp_path, target):
    """Finding `pkg.nope` with importlib would import pkg, the target's own code, in gpumemdoctor's process
    (issue 41, cause 7): the packages are looked into instead. A package whose code may add modules when it
    runs (pkgutil.extend_path) is taken at its word, and the target runs."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("open('imported', 'w').close()\n")
    (pkg / "there.py").write_text("open('ran', 'w').close()\n")
    (tmp_path / "ns" / "inner").mkdir(parents=True)  # a namespace package: no __init__.py
    for module in ("pkg.nope", "ns.nope", "ns.inner.nope"):
        code, _, err = invoke("run", "--allow-no-gpu", "-m", module)
        assert code == 2, err
        assert f"no module named {module!r}" in one_line(err)
    assert not (tmp_path / "imported").exists() and not (tmp_path / "ran").exists()
    code, _, err = invoke("run", "--allow-no-gpu", "-q", "-o", "r.json", "-m", "pkg.there")
    assert code == 0 and (tmp_path / "ran").exists(), err
    (pkg / "__init__.py").write_text("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
    code, _, err = invoke("run", "--allow-no-gpu", "-q", "-o", "r2.json", "-m", "pkg.elsewhere")
    assert code == 1 and (tmp_path / "r2.json").exists(), err  # it ran: Python said it found no such module


# -- internal errors and hangs -------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--poll-interval", "nan"], ["--poll-interval", "inf"], ["--interval", "nan"], ["--interval", "-inf"],
    ["--poll-interval", "NaN"],
])
def test_a_non_finite_interval_is_refused_before_the_target_runs(tmp_path, target, args):
    code, _, err = invoke("run", "--allow-no-gpu", *args, str(target))
    assert code == 2, err
    assert "not a finite number" in one_line(err) or "range" in err
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("args", [
    ["--interval", "nan"], ["--duration", "nan"], ["--duration", "inf"], ["--interval", "inf"],
])
def test_watch_refuses_non_finite_seconds(args):
    code, _, err = invoke("watch", "--pid", str(os.getpid()), *args)
    assert code == 2, err
    one_line(err)


# Where a size sits in a report: a path into the document.
SIZES = {"finding": ("findings", 0, "bytes"), "breakdown": ("breakdown", 0, "cache_bytes"),
         "peak": ("peaks", "nvml_bytes"), "reading": ("recording", "agents", 0, "samples", 0, "d", 0, 3),
         "nvml point": ("recording", "nvml", 0, "points", 0, 1), "growth": ("growth", 0, "grown_bytes"),
         "evidence": ("findings", 0, "evidence", "retained_bytes")}


def report_with(tmp_path: Path, where: str, value) -> str:
    """A report file: the hand-built leak with the size at `where` set to value."""
    doc = leak_report()
    *path, last = SIZES[where]
    target = doc
    for key in path:
        target = target[key]
    target[last] = value
    return dump(tmp_path / "r.json", doc)


@pytest.mark.parametrize("where", list(SIZES))
def test_a_huge_size_in_a_report_is_not_a_valid_report(tmp_path, where):
    path = report_with(tmp_path, where, 10 ** 400)
    for args in (["report", path], ["compare", path, path]):
        code, _, err = invoke(*args)
        assert code == 4, err
        assert "r.json" in one_line(err)


@pytest.mark.parametrize("field, value", [
    ("root_cause", {"searched": True, "when": "exit", "elapsed_s": {"": {}}}),  # found by test_properties
    ("decided_by", ["growth"]), ("curve", [[1.0, -5]]), ("garbage", {"types": [["dict"]]}),
])
def test_evidence_that_the_reporters_draw_is_checked(tmp_path, field, value):
    doc = leak_report()
    doc["findings"][0]["evidence"][field] = value
    code, _, err = invoke("report", dump(tmp_path / "r.json", doc))
    assert code == 4, err
    one_line(err)


def test_a_command_line_that_looks_like_markup_is_drawn_as_it_is(tmp_path, target):
    """rich took "[/]" in the target's arguments for markup and failed after the run."""
    code, _, err = invoke("run", "--allow-no-gpu", "-o", "r.json", "t.py", "[/]", "[bold]")
    assert code == 0, err
    assert "internal error" not in err and "python t.py [/] [bold]" in err
    code, out, err = invoke("report", "r.json", "--width", "200")
    assert code == 0 and "python t.py [/] [bold]" in out, err


def test_format_bytes_never_overflows():
    from gpumemdoctor.units import format_bytes
    assert format_bytes(10 ** 400).endswith("GiB")
    assert format_bytes(-10 ** 400).startswith("-")


def test_a_device_is_not_read_as_a_report():
    code, _, err = invoke("report", "/dev/zero")
    assert code == 2, err
    assert "not a regular file" in one_line(err)


def test_a_named_pipe_without_a_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    base = tmp_path / "base.json"
    os.mkfifo(base)
    (tmp_path / "t.py").write_text("pass\n")
    for args in (["report", str(fifo)], ["compare", str(fifo), str(fifo)],
                 ["run", "--allow-no-gpu", "--baseline", str(base), "t.py"]):
        result = run_cli(*args, cwd=tmp_path, timeout=30)
        assert result.returncode == 2, result.stderr
        assert "not a regular file" in one_line(result.stderr)


def test_a_report_larger_than_the_bound_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    from gpumemdoctor.app import report_file as report
    path = tmp_path / "big.json"
    path.write_text(json.dumps(leak_report()))
    monkeypatch.setattr(report, "MAX_REPORT_BYTES", 1000)
    code, _, err = invoke("report", str(path))
    assert code == 4, err
    assert "larger than" in one_line(err)


def test_a_file_that_lies_about_its_size_is_still_bounded():
    """/proc's files say they are 0 bytes long: the bound counts what is read, not st_size."""
    from gpumemdoctor.files import inputs
    from gpumemdoctor.errors import BadReportError
    assert os.stat("/proc/self/maps").st_size == 0
    with pytest.raises(BadReportError, match="larger than"):
        inputs.read_bounded("/proc/self/maps", 100, "report")


# -- the contract in docs/cli.md ------------------------------------------------------------

@pytest.mark.parametrize("option", [
    ["--junit", "/proc/gpumemdoctor-test.xml", "--max-peak", "1GiB"],
    ["--junit", "{tmp}/no-such-folder/j.xml", "--max-peak", "1GiB"],
    ["--update-baseline", "--baseline", "/proc/gpumemdoctor-test-baseline.json"],
    ["-o", "/proc/gpumemdoctor-test.json"],
    ["--html", "/proc/gpumemdoctor-test.html"],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_target_runs(tmp_path, target, option):
    option = [o.replace("{tmp}", str(tmp_path)) for o in option]
    code, _, err = invoke("run", "--allow-no-gpu", *option, str(target))
    assert code == 2, err
    one_line(err)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("target_code, args, expected", [
    (3, ["--max-peak", "1GiB", "--junit", "out/j.xml"], 3),  # the target's status wins
    (0, ["--max-peak", "1GiB", "--junit", "out/j.xml"], 10),  # the failed check's 10 stays
])
def test_an_output_that_fails_after_the_run_keeps_the_exit_status(tmp_path, target_code, args, expected):
    """The target removes the folder its outputs were to go to: the write fails after the run."""
    (tmp_path / "out").mkdir()
    (tmp_path / "t.py").write_text(f"import shutil\nshutil.rmtree('out')\nraise SystemExit({target_code})\n")
    result = run_cli("run", "--allow-no-gpu", "-q", *args, "t.py", cwd=tmp_path)
    assert result.returncode == expected, result.stderr
    assert "gpumemdoctor: error: cannot write" in result.stderr
    assert "Traceback" not in result.stderr


def after_run(tmp_path: Path, status: int, **outputs) -> int:
    """What `run` does once its target has ended, on a recording that measured every figure (the hand-built
    leak's): a run without a GPU measures none, and a baseline is then not written at all."""
    from gpumemdoctor.app.pipeline import RunOutputs, after_run as _after_run

    given = {"name": "t", "report": str(tmp_path / "r.json"), "force": True, "quiet": True, "html": None,
             "html_next_to_json": False, "junit": None, "new_baseline": None, **outputs}
    return _after_run(make_recording(), status, RunOutputs(**given), checks.Policy())


@pytest.mark.parametrize("status", [0, 5])
def test_a_baseline_that_fails_to_be_written_after_the_run_keeps_the_exit_status(tmp_path, capsys, status):
    """Its folder was removed while the target ran: said in one line, and the status stays the target's."""
    assert after_run(tmp_path, status, new_baseline=str(tmp_path / "gone" / "b.json")) == status
    err = capsys.readouterr().err
    assert "gpumemdoctor: error: cannot write" in err and "Traceback" not in err


def test_a_baseline_with_a_figure_missing_is_not_a_valid_baseline(tmp_path, target):
    doc = checks.baseline_document(make_recording(), diagnose(make_recording()))
    del doc["figures"]["live_tensor_bytes"]
    code, _, err = invoke("run", "--allow-no-gpu", "--baseline", dump(tmp_path / "b.json", doc), str(target))
    assert code == 4, err
    assert "live_tensor_bytes" in one_line(err)
    assert not (tmp_path / "ran").exists()


def test_a_baseline_figure_that_is_null_fails_its_check(tmp_path):
    recording = make_recording()
    diagnosis = diagnose(recording)
    doc = checks.baseline_document(recording, diagnosis)
    doc["figures"]["peak_allocated_bytes"] = None
    baseline = baseline_file.load_baseline(dump(tmp_path / "b.json", doc))
    results = checks.evaluate(recording, diagnosis, checks.Policy(baseline=baseline))
    peak = next(r for r in results if r.name == "baseline peak_allocated_bytes")
    assert not peak.passed and "not measured" in peak.message


def test_compare_of_two_reports_without_a_gpu_fails(tmp_path):
    old = dump(tmp_path / "old.json", no_gpu_report())
    new = dump(tmp_path / "new.json", no_gpu_report(4343))
    code, out, err = invoke("compare", old, new)
    assert code == 10, out + err
    assert "0 passed, 2 failed" in out and "not measured" in out


@pytest.mark.parametrize("where", list(SIZES))
def test_a_negative_size_is_not_a_valid_report(tmp_path, where):
    path = report_with(tmp_path, where, -451 << 20)
    for args in (["report", path], ["compare", path, path]):
        code, out, err = invoke(*args)
        assert code == 4, out + err
        assert "0 or more" in one_line(err)


def test_debug_keeps_the_documented_exit_code(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    result = run_cli("--debug", "report", str(bad), cwd=tmp_path)
    assert result.returncode == 4
    assert "Traceback" in result.stderr
    result = run_cli("--debug", "report", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    """`report FILE | head -1`: the rest of the output is dropped, quietly, and the exit code stays."""
    for args, expected in ((["report", str(LONG)], 0),
                           (["compare", str(CLEAN), str(FIXTURES / "reports" / "leak_training_list.json")], 10)):
        proc = subprocess.Popen([sys.executable, "-m", "gpumemdoctor", *args, "--width", "80"]
                                if args[0] == "report" else [sys.executable, "-m", "gpumemdoctor", *args],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
                                stdin=subprocess.DEVNULL)
        proc.stdout.readline()
        proc.stdout.close()  # as head -1 does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == expected, err
        assert err == "" or err.startswith("gpumemdoctor: note:"), err


# -- surprises --------------------------------------------------------------------------------

def test_the_report_may_not_overwrite_the_script(tmp_path):
    victim = tmp_path / "victim.py"
    victim.write_text("print('mine')\n")
    code, _, err = invoke("run", "--allow-no-gpu", "-o", str(victim), "--force", str(victim))
    assert code == 2, err
    assert "victim.py" in one_line(err)
    assert victim.read_text() == "print('mine')\n"


@pytest.mark.parametrize("outputs", [
    ["-o", "same.json", "--html", "same.json"],
    ["--junit", "t.py", "--max-peak", "1GiB"],
    ["--junit", "same.json", "-o", "same.json", "--max-peak", "1GiB"],
    ["--update-baseline", "--baseline", "same.json", "-o", "same.json"],
    ["--snapshot", "t.py"],
    ["--html", "./t.py", "--force"],
])
def test_run_refuses_two_files_in_one_place(tmp_path, target, monkeypatch, outputs):
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("run", "--allow-no-gpu", *outputs, "--force", "t.py")
    assert code == 2, err
    one_line(err)
    assert not (tmp_path / "ran").exists()
    assert target.read_text().startswith("open('ran'")


def test_report_and_compare_refuse_to_write_over_their_input(tmp_path):
    path = dump(tmp_path / "r.json", leak_report())
    before = Path(path).read_text()
    for args in (["report", path, "--html", path, "--force"],
                 ["compare", path, path, "--junit", path],
                 ["report", path, str(CLEAN), "--html", str(CLEAN), "--force"]):
        code, _, err = invoke(*args)
        assert code == 2, (args, err)
        one_line(err)
    assert Path(path).read_text() == before


def test_a_bare_number_is_not_a_tolerance(tmp_path, target):
    for value in ("5", "0", "5.5"):
        code, _, err = invoke("compare", str(CLEAN), str(CLEAN), "--tolerance", value)
        assert code == 2, err
        assert f"{value}%" in one_line(err) and f"{value}MiB" in err
    code, _, err = invoke("run", "--allow-no-gpu", "--nvml-tolerance", "5", str(target))
    assert code == 2 and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("value", ["", "leak,,", ",leak", " , "])
def test_fail_on_refuses_empty_kinds(tmp_path, target, value):
    code, _, err = invoke("run", "--allow-no-gpu", "--fail-on", value, str(target))
    assert code == 2, err
    assert "--fail-on" in one_line(err)
    assert not (tmp_path / "ran").exists()


def test_junit_without_a_check_is_refused(tmp_path, target):
    code, _, err = invoke("run", "--allow-no-gpu", "--junit", str(tmp_path / "j.xml"), str(target))
    assert code == 2, err
    assert "--junit" in one_line(err) and "--max-peak" in err
    assert not (tmp_path / "ran").exists()


def test_expect_free_says_a_size_is_not_negative():
    for args in (["--expect-free", "-1GiB"], ["--expect-free=-1GiB"], ["--expect-free", "-5"]):
        code, _, err = invoke("ps", *args)
        assert code == 2, err
        line = one_line(err)
        assert "must not be negative" in line and "No such option" not in line


def test_an_output_folder_that_is_a_file_is_named_so(tmp_path, target):
    (tmp_path / "FILE").write_text("")
    code, _, err = invoke("run", "--allow-no-gpu", "-o", str(tmp_path / "FILE" / "r.json"), str(target))
    assert code == 2
    assert "is a file, not a folder" in one_line(err)


def test_every_file_written_is_private_to_its_owner(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    for name in ("r.json", "j.xml", "b.json", "p.html"):
        (tmp_path / name).write_text("old\n")
        os.chmod(tmp_path / name, 0o644)
    result = run_cli("run", "--allow-no-gpu", "-q", "-o", "r.json", "--force", "--junit", "j.xml",
                     "--max-peak", "1GiB", "t.py", cwd=tmp_path)
    assert result.returncode == 10, result.stderr
    assert after_run(tmp_path, 0, report=str(tmp_path / "r2.json"), new_baseline=str(tmp_path / "b.json")) == 0
    code, _, err = invoke("report", str(tmp_path / "r.json"), "--html", str(tmp_path / "p.html"), "--force")
    assert code == 0, err
    (tmp_path / "c.xml").unlink(missing_ok=True)
    code, _, err = invoke("compare", str(CLEAN), str(CLEAN), "--junit", str(tmp_path / "c.xml"))
    assert code == 0, err
    for name in ("r.json", "j.xml", "b.json", "p.html", "c.xml"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name
        assert (tmp_path / name).read_text() != "old\n"


def test_report_says_when_this_version_judges_the_recording_differently():
    code, out, err = invoke("report", str(LONG), "--width", "100")
    assert code == 0, err
    assert out.startswith("gpumemdoctor verdict: clean")  # as the report was written
    assert "judges its recording differently" in err and "leak" in err and "--rejudge" in err
    code, out, err = invoke("report", "--rejudge", str(LONG), "--width", "100")
    assert code == 0, err
    assert out.startswith("gpumemdoctor verdict: leak")
    assert "judged again by gpumemdoctor" in out
    assert err == ""


def test_report_says_nothing_when_the_judgement_is_the_same():
    code, out, err = invoke("report", str(CLEAN), "--width", "100")
    assert code == 0 and err == ""


# -- the README, for a newcomer ----------------------------------------------------------------

def test_readme_gives_a_cpu_torch_and_an_extra_that_exists():
    root = Path(__file__).parent.parent
    readme = (root / "README.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    tests = readme.split("## Run the tests", 1)[1]
    assert tests.index('pip install -e ".[test]"') < tests.index("python -m pytest")
    assert "minutes" in tests
    for path in [root / "README.md", *(root / "docs").glob("*.md"), *(root / "gpumemdoctor").rglob("*.py")]:
        assert '"gpumemdoctor[html]"' not in path.read_text(), path


# -- issue 28: the rows that need a run, a pipe or a watch --------------------------------------

def _watch_env(tmp_path: Path, pid: int) -> dict:
    """The NVML test double, with `pid` holding 1 GiB on its one GPU."""
    from .test_watch import DOUBLES_PATH, GIB, _write

    state = tmp_path / "nvml.json"
    _write(state, pid, GIB)
    return {"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)}


SAMPLE_LINE = re.compile(r"^\s*\d+\.\ds  ", re.M)  # a plain line of `watch`, one per sample


def test_watch_goes_on_when_its_log_cannot_be_written(tmp_path, sleeper):
    """`watch --jsonl /dev/full` (a full disk): said once, and the samples and the summary still come."""
    result = run_cli("watch", "--pid", str(sleeper.pid), "--interval", "0.05", "--duration", "1.5", "--no-tui",
                     "--jsonl", "/dev/full", cwd=tmp_path, env=_watch_env(tmp_path, sleeper.pid))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("gpumemdoctor: warning:") == 1, result.stderr
    assert "/dev/full" in result.stderr and "No space left" in result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert len(SAMPLE_LINE.findall(result.stdout)) >= 5, result.stdout  # it kept watching
    assert f"Watched PID {sleeper.pid}" in result.stdout


def test_watch_goes_on_when_the_reader_of_its_log_goes_away(tmp_path, sleeper):
    """`watch --jsonl PIPE` whose reader stops after the first line: said once; watching goes on."""
    import select

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    proc = subprocess.Popen([sys.executable, "-m", "gpumemdoctor", "watch", "--pid", str(sleeper.pid), "--interval",
                             "0.05", "--duration", "2", "--no-tui", "--jsonl", str(fifo)], cwd=tmp_path,
                            env=cli_env(_watch_env(tmp_path, sleeper.pid)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([reader], [], [], 30)[0], "no line came"
        assert b'"gpu_bytes"' in os.read(reader, 1 << 16)
    finally:
        os.close(reader)  # the reader goes away
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.count("gpumemdoctor: warning:") == 1 and "log.fifo" in err, err
    assert "Traceback" not in err
    assert len(SAMPLE_LINE.findall(out)) >= 10, out
    assert f"Watched PID {sleeper.pid}" in out


def test_watch_appends_to_its_own_log_and_force_replaces_another_file(tmp_path, sleeper):
    env = _watch_env(tmp_path, sleeper.pid)
    watch = ["watch", "--pid", str(sleeper.pid), "--interval", "0.05", "--duration", "0.3", "--no-tui"]
    assert run_cli(*watch, "--jsonl", "w.jsonl", cwd=tmp_path, env=env).returncode == 0
    first = (tmp_path / "w.jsonl").read_text().splitlines()
    assert run_cli(*watch, "--jsonl", "w.jsonl", cwd=tmp_path, env=env).returncode == 0
    both = (tmp_path / "w.jsonl").read_text().splitlines()
    assert both[:len(first)] == first and len(both) > len(first)  # appended, nothing lost
    report = dump(tmp_path / "r.json", leak_report())
    result = run_cli(*watch, "--jsonl", report, "--force", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert all("gpu_bytes" in json.loads(line) for line in Path(report).read_text().splitlines())
    assert stat.S_IMODE(os.stat(report).st_mode) == 0o600


def test_update_baseline_is_refused_when_the_run_measured_nothing(tmp_path):
    """The GPU is there (the NVML double), but the target never used PyTorch: no figure to keep."""
    (tmp_path / "t.py").write_text("pass\n")
    env = _watch_env(tmp_path, 4_000_000)
    result = run_cli("run", "-q", "--update-baseline", "--baseline", "b.json", "t.py", cwd=tmp_path, env=env)
    assert result.returncode == 10, result.stderr
    assert "gpumemdoctor: error: --update-baseline" in result.stderr and "not written" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "b.json").exists()
    (tmp_path / "t.py").write_text("raise SystemExit(3)\n")
    result = run_cli("run", "-q", "--update-baseline", "--baseline", "b.json", "t.py", cwd=tmp_path, env=env)
    assert result.returncode == 3 and not (tmp_path / "b.json").exists()  # the target's own status wins


def test_paths_are_never_wrapped_and_lines_not_padded_off_a_terminal(tmp_path):
    """Standard error is a pipe (a CI log): the paths, the Report:, HTML report: and -q lines stay whole."""
    pytest.importorskip("plotly")
    folder = tmp_path.joinpath(*["a-rather-long-folder-name-for-ci"] * 3)
    folder.mkdir(parents=True)
    script = folder / "the-training-script-of-a-long-ci-job.py"
    script.write_text("pass\n")
    report, page = folder / "report-of-a-long-ci-job.json", folder / "page-of-a-long-ci-job.html"
    result = run_cli("run", "--allow-no-gpu", "-o", str(report), "--html", str(page), str(script), "--an-arg",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert f"Target   python {script} --an-arg" in lines, result.stderr
    assert f"Report: {report}" in lines and f"HTML report: {page}" in lines, result.stderr
    assert [line for line in lines if line != line.rstrip()] == []
    result = run_cli("run", "--allow-no-gpu", "-q", "--force", "-o", str(report), "--html", str(page), str(script),
                     cwd=tmp_path)
    assert result.stderr.splitlines() == [f"gpumemdoctor verdict: none (no GPU measured)  report: {report}  "
                                          f"html: {page}"], result.stderr
