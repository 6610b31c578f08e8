"""The real command line, run in a subprocess, on a machine without a GPU (CPU only).

`gpumemdoctor run --allow-no-gpu` runs the target with the agent but measures
nothing GPU-side; these tests check everything around the measurement: streams,
argv, exit statuses, signals, the report file, and the one-line errors.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import gpumemdoctor
from gpumemdoctor.system import nvml

NVML_HERE = nvml.available()
needs_no_nvml = pytest.mark.skipif(NVML_HERE, reason="NVML works here; this checks the no-GPU path")

REPORT_SCHEMA = "gpumemdoctor.report/1"


# -- helpers -------------------------------------------------------------------------

def the_report(cwd: Path, stem: str) -> tuple[Path, int, dict]:
    """The one default-named report in cwd: its path, the pid in its name, its content."""
    found = sorted(cwd.glob(f"gpumemdoctor-{stem}.*.json"))
    assert len(found) == 1, f"expected one report for {stem!r} in {cwd}, found {found}"
    m = re.fullmatch(rf"gpumemdoctor-{re.escape(stem)}\.(\d+)\.json", found[0].name)
    assert m, found[0].name
    return found[0], int(m.group(1)), json.loads(found[0].read_text())


def no_reports(cwd: Path) -> list[Path]:
    return sorted(cwd.glob("gpumemdoctor-*.json"))


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The tool's whole stderr, checked to be one `gpumemdoctor: error:` line without a traceback."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{result.stderr}"
    assert lines[0].startswith("gpumemdoctor: error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def read_until(proc: subprocess.Popen, pattern: bytes, timeout: float, data: bytes = b"") -> tuple[bytes, re.Match]:
    """Read proc's stdout until `pattern` (a regex) matches what was read so far."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(pattern, data)
        if m:
            return data, m
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{pattern!r} not seen in {timeout} s; stdout so far {data!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"stdout closed before {pattern!r}; got {data!r}, "
                                     f"exit status {proc.poll()}")
            data += chunk


def read_rest(proc: subprocess.Popen, timeout: float, data: bytes = b"") -> bytes:
    """Read proc's stdout to its end (every holder of the pipe closed it)."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"stdout still open after {timeout} s; got {data!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return data
            data += chunk


# -- help and version ------------------------------------------------------------------

def imported_modules(importtime_stderr: str) -> set[str]:
    modules = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            modules.add(line.rsplit("|", 1)[1].strip())
    return modules


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["report", "--help"]],
                         ids=["top", "run", "report"])
def test_help_is_cheap_it_loads_neither_torch_nor_pynvml_nor_plotly(cli, tmp_path, args):
    result = cli(*args, cwd=tmp_path, python_flags=("-X", "importtime"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Usage:" in result.stdout
    modules = imported_modules(result.stderr)
    assert "gpumemdoctor.cli" in modules  # the import list was read at all
    heavy = sorted(m for m in modules if m.split(".")[0] in ("torch", "pynvml", "plotly"))
    assert heavy == []


def test_run_help_says_options_go_before_the_script(cli, tmp_path):
    result = cli("run", "--help", cwd=tmp_path)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # click re-wraps the text to the width
    assert "--allow-no-gpu" in text
    assert "Options go before the script" in text


def test_no_arguments_shows_the_help_not_an_error(cli, tmp_path):
    result = cli(cwd=tmp_path)
    assert "Usage:" in result.stdout + result.stderr
    assert "gpumemdoctor: error: Usage:" not in result.stderr


def test_version(cli, tmp_path):
    result = cli("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert gpumemdoctor.__version__ in result.stdout
    assert result.stderr == ""


# -- no GPU ------------------------------------------------------------------------------

@needs_no_nvml
def test_without_allow_no_gpu_it_refuses_and_does_not_run_the_target(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        open("ran.txt", "w").write("the target ran")
    """)
    result = cli("run", "t.py", cwd=tmp_path)
    assert result.returncode == 3
    line = one_error_line(result)
    assert "NVML" in line
    assert "--allow-no-gpu" in line
    assert result.stdout == ""
    assert not (tmp_path / "ran.txt").exists()
    assert no_reports(tmp_path) == []


# -- what passes through to the target ---------------------------------------------------

def test_streams_pass_through_unchanged_and_a_report_is_written(cli, script, tmp_path):
    script(tmp_path, "t.py", r"""
        import os, sys
        sys.stdout.write("first line\n\tsecond  line, tab and two spaces\n")
        sys.stderr.write("to stderr, line 1\nto stderr, line 2\n")
        sys.stdout.write(f"pid {os.getpid()}\nno newline at the end")
    """)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, env={"TMPDIR": str(tmpdir)})
    assert result.returncode == 0, result.stderr
    pid = int(re.search(r"^pid (\d+)$", result.stdout, re.M).group(1))
    assert result.stdout == f"first line\n\tsecond  line, tab and two spaces\npid {pid}\nno newline at the end"
    # The tool's own summary goes to stderr, after everything the target wrote there.
    assert result.stderr.startswith("to stderr, line 1\nto stderr, line 2\n")
    assert "gpumemdoctor verdict" in result.stderr[len("to stderr, line 1\nto stderr, line 2\n"):]

    path, name_pid, report = the_report(tmp_path, "t")
    assert name_pid == pid
    assert path.name in result.stderr
    assert report["schema"] == REPORT_SCHEMA
    if not NVML_HERE:
        assert report["verdict"] is None
        assert report["recording"]["nvml_available"] is False
    assert report["target"]["argv"] == ["t.py"]
    assert report["target"]["pid"] == pid
    assert report["target"]["exit_code"] == 0
    assert report["target"]["signal"] is None
    # The agent reached the target (it records even where there is nothing to sample) ...
    agents = {a["pid"]: a for a in report["recording"]["agents"]}
    assert pid in agents and agents[pid]["exited_normally"] is True
    # ... and the run folder it wrote to is gone.
    assert list(tmpdir.iterdir()) == []


def test_quiet_prints_only_the_verdict_line(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('hi')\n")
    result = cli("run", "-q", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == "hi\n"
    path, _, _ = the_report(tmp_path, "t")
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumemdoctor verdict:")
    assert lines[0].endswith(f"report: {path.name}")


TARGET_ARGS = ["-o", "x", "--force", "--interval", "3", "--", "--allow-no-gpu", "-m", "mod", "-q"]


@pytest.mark.parametrize("ours", [
    ["--allow-no-gpu"],
    ["--interval", "0.05", "--allow-no-gpu"],
    ["--interval=0.05", "--allow-no-gpu", "--"],
], ids=["plain", "option-with-value", "equals-and-double-dash"])
def test_argv_after_the_script_is_the_targets_even_when_it_looks_like_ours(cli, script, tmp_path, ours):
    script(tmp_path, "t.py", """
        import json, sys
        print(json.dumps(sys.argv))
    """)
    result = cli("run", *ours, "t.py", *TARGET_ARGS, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["t.py", *TARGET_ARGS]
    assert not (tmp_path / "x").exists()  # -o x was not taken as ours
    _, _, report = the_report(tmp_path, "t")
    assert report["target"]["argv"] == ["t.py", *TARGET_ARGS]


def test_stdin_passes_through(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        import sys
        data = sys.stdin.read()
        sys.stdout.write(f"read {len(data)} chars: " + data.upper())
    """)
    text = "abc\nsecond line\n" + "x" * 100_000 + "\n"
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, input=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"read {len(text)} chars: " + text.upper()


def test_target_sees_the_sys_path_python_would_give_it(cli, script, cli_env, tmp_path):
    script(tmp_path, "t.py", """
        import json, sys
        print(json.dumps(sys.path))
    """)
    plain = subprocess.run([sys.executable, "t.py"], cwd=tmp_path, capture_output=True, text=True,
                           env=cli_env(), timeout=60, stdin=subprocess.DEVNULL)
    under = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert under.returncode == 0, under.stderr
    assert json.loads(under.stdout) == json.loads(plain.stdout)
    assert not any(p.rstrip(os.sep).endswith("_bootstrap") for p in json.loads(under.stdout))


# -- exit statuses -------------------------------------------------------------------------

EXITS = {
    "exit-0": ("import sys\nsys.exit(0)\n", 0, 0, None),
    "exit-7": ("import sys\nsys.exit(7)\n", 7, 7, None),
    "exception": ("def f():\n    raise ValueError('boom from the target')\nf()\n", 1, 1, None),
    "os-_exit-5": ("import os\nos._exit(5)\n", 5, 5, None),
    "sigterm-self": ("import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(10)\n",
                     128 + signal.SIGTERM, None, signal.SIGTERM),
    "syntax-error": ("x = (1,\nprint('never')\n", 1, 1, None),
}


@pytest.mark.parametrize("name", list(EXITS))
def test_exit_status_is_the_targets(cli, script, tmp_path, name):
    source, status, exit_code, signum = EXITS[name]
    script(tmp_path, "t.py", source)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == status, result.stderr
    assert "gpumemdoctor: error" not in result.stderr
    assert "never" not in result.stdout
    _, pid, report = the_report(tmp_path, "t")
    assert report["schema"] == REPORT_SCHEMA
    if not NVML_HERE:
        assert report["verdict"] is None
    assert report["target"]["pid"] == pid
    assert report["target"]["exit_code"] == exit_code
    assert report["target"]["signal"] == signum
    if name == "exception":
        # The target's own traceback, not one of the tool's.
        assert "Traceback (most recent call last):" in result.stderr
        assert 't.py", line 2, in f' in result.stderr
        assert "ValueError: boom from the target" in result.stderr
        assert "gpumemdoctor/" not in result.stderr.split("ValueError")[0]
    if name == "syntax-error":
        assert 't.py", line 1' in result.stderr
        assert "SyntaxError" in result.stderr
    if signum:
        assert "killed by signal 15" in result.stderr


# -- modules ---------------------------------------------------------------------------------

def test_module_runs_with_its_args(cli, script, tmp_path):
    script(tmp_path, "mymod.py", """
        import json, sys
        print(json.dumps(sys.argv))
    """)
    result = cli("run", "--allow-no-gpu", "-m", "mymod", "a", "--force", "-o", "y", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    assert Path(argv[0]) == tmp_path / "mymod.py"
    assert argv[1:] == ["a", "--force", "-o", "y"]
    assert not (tmp_path / "y").exists()
    _, _, report = the_report(tmp_path, "mymod")
    assert report["target"]["argv"] == ["-m", "mymod", "a", "--force", "-o", "y"]


@pytest.mark.parametrize("spelling", [["-m", "pkg.sub"], ["-mpkg.sub"], ["--module=pkg.sub"]],
                         ids=["-m space", "-mglued", "--module="])
def test_dotted_module_spellings(cli, script, tmp_path, spelling):
    script(tmp_path, "pkg/__init__.py", "")
    script(tmp_path, "pkg/sub.py", """
        import sys
        print("sub ran with", sys.argv[1:])
    """)
    result = cli("run", "--allow-no-gpu", *spelling, "arg1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "sub ran with ['arg1']\n"
    the_report(tmp_path, "pkg-sub")


def test_folder_with_main_runs(cli, script, tmp_path):
    script(tmp_path, "app/__main__.py", "print('app main')\n")
    result = cli("run", "--allow-no-gpu", "app", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "app main\n"
    the_report(tmp_path, "app")


def test_missing_module_is_a_usage_error(cli, tmp_path):
    result = cli("run", "--allow-no-gpu", "-m", "nosuchmodule_gpumemdoctor_test", cwd=tmp_path)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "no module named" in line
    assert "nosuchmodule_gpumemdoctor_test" in line
    assert no_reports(tmp_path) == []


# -- bad input: one line, exit 2, the target never runs -----------------------------------------

def _binary(p: Path) -> None:
    (p / "blob.py").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00open('ran.txt','w')\n")


def _bash(p: Path) -> None:
    (p / "s.sh").write_text("#!/bin/bash\necho ran > ran.txt\n")


def _existing_output(p: Path) -> None:
    (p / "exists.json").write_text("keep me\n")


BAD_INPUTS = {
    "missing script": (["missing.py"], None, "missing.py: no such file"),
    "folder without __main__": (["adir"], lambda p: (p / "adir").mkdir(), "without __main__.py"),
    "binary file": (["blob.py"], _binary, "binary file"),
    "bash script": (["s.sh"], _bash, "/bin/bash"),
    "no script": ([], None, "give a script"),
    "unknown option": (None, None, "--nope"),
    "-o existing file": (["-o", "exists.json", "t.py"], _existing_output, "--force"),
    "-o folder missing": (["-o", "nodir/r.json", "t.py"], None, "does not exist"),
    "--snapshot existing file": (["--snapshot", "exists.json", "t.py"], _existing_output, "--snapshot"),
    "--snapshot folder missing": (["--snapshot", "nodir/s.pickle", "t.py"], None, "does not exist"),
    "--trace unknown mode": (["--trace", "sometimes", "t.py"], None, "'auto', 'on', 'events', 'off'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(cli, script, tmp_path, case):
    args, setup, expected = BAD_INPUTS[case]
    script(tmp_path, "t.py", "open('ran.txt', 'w').write('the target ran')\n")
    if setup:
        setup(tmp_path)
    argv = ["run", "--nope", "t.py"] if args is None else ["run", "--allow-no-gpu", *args]
    result = cli(*argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert expected in line
    assert result.stdout == ""
    assert not (tmp_path / "ran.txt").exists()
    assert no_reports(tmp_path) == []
    if case in ("-o existing file", "--snapshot existing file"):
        assert (tmp_path / "exists.json").read_text() == "keep me\n"


def test_output_with_force_overwrites(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('ran')\n")
    (tmp_path / "exists.json").write_text("keep me\n")
    result = cli("run", "--allow-no-gpu", "-o", "exists.json", "--force", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"
    report = json.loads((tmp_path / "exists.json").read_text())
    assert report["schema"] == REPORT_SCHEMA
    assert report["target"]["argv"] == ["t.py"]
    assert no_reports(tmp_path) == []  # no default-named report besides


# -- signals ---------------------------------------------------------------------------------------

SIGNAL_TARGET = """
    import os, signal, sys, time

    def on_term(signum, frame):
        print("got term", flush=True)
        sys.exit(9)

    signal.signal(signal.SIGTERM, on_term)
    # Whatever the test runner's own SIGINT disposition, KeyboardInterrupt is what python does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:  # "ready" inside the try: a signal that comes as soon as it is read still lands here
        print("ready", os.getpid(), flush=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.02)
    except KeyboardInterrupt:
        print("got int", flush=True)
        sys.exit(4)
    print("no signal came", flush=True)
"""


@pytest.mark.parametrize("signum, reply, status", [
    (signal.SIGTERM, b"got term", 9),
    (signal.SIGINT, b"got int", 4),
], ids=["SIGTERM", "SIGINT"])
def test_signals_are_forwarded_to_the_target(popen_cli, script, tmp_path, signum, reply, status):
    script(tmp_path, "t.py", SIGNAL_TARGET)
    with open(tmp_path / "tool-stderr.txt", "wb") as err:
        proc = popen_cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, stderr=err,
                         env={"TMPDIR": str(tmp_path)})
        out, m = read_until(proc, rb"ready (\d+)\n", timeout=30)
        pid = int(m.group(1))
        target = psutil.Process(pid)
        try:
            proc.send_signal(signum)
            assert proc.wait(timeout=20) == status, (tmp_path / "tool-stderr.txt").read_text()
            out = read_rest(proc, timeout=10, data=out)
        finally:
            if target.is_running():  # only when the test failed: the tool left it behind
                target.kill()
    assert reply in out
    assert b"no signal came" not in out
    report = json.loads((tmp_path / f"gpumemdoctor-t.{pid}.json").read_text())
    assert report["target"]["exit_code"] == status
    assert report["target"]["signal"] is None


# A target that counts the signals it gets: a signal sent to the whole process group reaches it
# once, from the kernel, and the supervisor, which gets it too, must not send a second copy.
COUNTING_TARGET = """
    import os, signal, sys, time

    got = []
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    print("ready", os.getpid(), flush=True)
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.0)  # a second copy, if one is sent, comes within this
    print("signals", len(got), flush=True)
    sys.exit(4)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_whole_process_group_reaches_the_target_once(popen_cli, script, tmp_path, signum):
    """No terminal (popen_cli gives the tool a session of its own, as in CI), and the signal goes to
    the whole process group, as a CI runner or a scheduler sends it (issue 28, row 10)."""
    script(tmp_path, "t.py", COUNTING_TARGET)
    for _ in range(3):
        proc = popen_cli("run", "--allow-no-gpu", "-q", "-o", "r.json", "--force", "t.py", cwd=tmp_path)
        out, _ = read_until(proc, rb"ready (\d+)\n", timeout=30)
        os.killpg(proc.pid, signum)
        assert proc.wait(timeout=30) == 4, proc.stderr.read()
        assert b"signals 1\n" in read_rest(proc, timeout=10, data=out)


def test_sigint_to_the_whole_process_group_leaves_no_traceback_of_the_tool(popen_cli, script, tmp_path):
    """The target dies of the KeyboardInterrupt and its exit takes a while (as the agent's exit probes
    do): a second SIGINT landed in it 5 times of 9 ("Exception ignored in atexit callback", "lost
    sys.stderr"). Its own traceback of the interrupt is the program's, and stays."""
    script(tmp_path, "t.py", """
        import atexit, os, time

        def slow_exit():  # Python work at exit, where a second interrupt would land
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                sum(range(1000))

        atexit.register(slow_exit)
        print("ready", os.getpid(), flush=True)
        time.sleep(30)
    """)
    for attempt in range(9):
        proc = popen_cli("run", "--allow-no-gpu", "-o", "r.json", "--force", "t.py", cwd=tmp_path)
        read_until(proc, rb"ready (\d+)\n", timeout=30)
        time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        err = proc.stderr.read().decode()
        assert "Exception ignored" not in err and "lost sys.stderr" not in err, (attempt, err)
        assert err.count("Traceback") == 1 and err.count("KeyboardInterrupt") == 1, (attempt, err)
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["target"]["signal"] == signal.SIGINT and report["target"]["exit_code"] is None


def test_target_runs_on_when_the_supervisor_is_killed(popen_cli, script, tmp_path):
    marker = tmp_path / "finished.txt"
    script(tmp_path, "t.py", f"""
        import os, time
        print("ready", os.getpid(), flush=True)
        time.sleep(1.5)
        open({str(marker)!r} + ".tmp", "w").write("finished")
        os.replace({str(marker)!r} + ".tmp", {str(marker)!r})  # seen whole or not at all
        print("done", flush=True)
    """)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with open(tmp_path / "tool-stderr.txt", "wb") as err:
        proc = popen_cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, stderr=err,
                         env={"TMPDIR": str(tmpdir)})
        out, m = read_until(proc, rb"ready (\d+)\n", timeout=30)
        target = psutil.Process(int(m.group(1)))
        try:
            assert target.ppid() == proc.pid  # the target is the supervisor's own child
            proc.kill()  # SIGKILL to the supervisor only
            assert proc.wait(timeout=10) == -signal.SIGKILL
            assert target.is_running() and not marker.exists()  # it was mid-run when its parent died
            deadline = time.monotonic() + 15
            while not marker.exists() and target.is_running() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marker.read_text() == "finished"
            out, _ = read_until(proc, rb"done\n", timeout=10, data=out)
        finally:
            if target.is_running():
                target.kill()
    assert no_reports(tmp_path) == []  # a killed supervisor writes none


# -- the report command ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_report(tmp_path_factory, cli, script) -> dict:
    """A report written by a real --allow-no-gpu run, as parsed JSON."""
    folder = tmp_path_factory.mktemp("saved")
    script(folder, "t.py", "import sys\nprint('hello')\nsys.exit(3)\n")
    result = cli("run", "--allow-no-gpu", "-o", "r.json", "t.py", cwd=folder)
    assert result.returncode == 3, result.stderr
    return json.loads((folder / "r.json").read_text())


def test_report_renders_a_saved_report(cli, tmp_path, saved_report):
    (tmp_path / "r.json").write_text(json.dumps(saved_report))
    result = cli("report", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "verdict" in result.stdout
    assert "python t.py" in result.stdout
    assert "exit 3" in result.stdout
    assert result.stderr == ""


def test_report_of_a_missing_file_is_a_usage_error(cli, tmp_path):
    result = cli("report", "nope.json", cwd=tmp_path)
    assert result.returncode == 2
    assert "nope.json" in one_error_line(result)


def _bad_json(_report: dict) -> str:
    return '{"schema": "gpumemdoctor.report/1", '


def _wrong_schema(report: dict) -> str:
    return json.dumps({**report, "schema": "gpumemdoctor.report/999"})


def _unknown_verdict(report: dict) -> str:
    return json.dumps({**report, "verdict": "haunted"})


def _nan(report: dict) -> str:
    return json.dumps(report).replace('"started_wall": ', '"started_wall": NaN, "was": ', 1)


@pytest.mark.parametrize("make, expected", [
    (_bad_json, "invalid JSON"),
    (_wrong_schema, "gpumemdoctor.report/999"),
    (_unknown_verdict, "haunted"),
    (_nan, "NaN"),
], ids=["invalid-json", "wrong-schema", "unknown-verdict", "nan"])
def test_report_refuses_what_is_not_a_report(cli, tmp_path, saved_report, make, expected):
    (tmp_path / "r.json").write_text(make(saved_report))
    result = cli("report", "r.json", cwd=tmp_path)
    assert result.returncode == 4
    line = one_error_line(result)
    assert "r.json" in line and expected in line
    assert result.stdout == ""


def test_the_signal_witness_keeps_a_signal_that_comes_while_it_starts():
    """The witness is made with the signals blocked: one that reaches it before its interpreter has
    started stays pending, and it says so when asked (it used to die of it, and the supervisor then
    sent the target a second copy of a group's signal)."""
    from gpumemdoctor.supervise.signals import _Witness

    witness = _Witness.start([signal.SIGUSR1])
    try:
        os.kill(witness.proc.pid, signal.SIGUSR1)  # microseconds after its fork: long before it runs
        assert witness.also_got(signal.SIGUSR1) is True
        assert witness.proc is not None and witness.proc.poll() is None
        assert witness.also_got(signal.SIGUSR1) is False  # taken once; none is pending now
    finally:
        witness.close()


def test_a_run_without_checks_does_not_import_the_diagnosis_before_the_target_starts():
    """The checks' module imports the whole diagnosis (0.1 s): with no check asked for it is imported
    while the target runs (app/pipeline.py's prepare), not on the way to starting it."""
    code = ("import sys\n"
            "from gpumemdoctor.cli.run import _policy\n"
            "assert _policy(None, None, None, '5%', None, None, None, False) is None\n"
            "assert 'gpumemdoctor.diagnosis.diagnose' not in sys.modules, 'imported before the run'\n"
            "policy = _policy(1 << 30, None, None, '5%', None, None, None, False)\n"
            "assert policy.max_peak_bytes == 1 << 30 and not policy.empty\n"
            "assert _policy(None, None, None, '7%', None, None, None, False).tolerance.fraction == 0.07\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
