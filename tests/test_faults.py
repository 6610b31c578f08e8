"""When the machine misbehaves: the real CLI in a subprocess, CPU-only targets, the NVML test double.

Each test is one documented behaviour (README, "Long runs and faults"): NVML failing
mid-run, a report that cannot be written, a target killed by SIGKILL while its host
memory rose, the supervisor killed, and `watch --jsonl` followed as it is written.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpumemdoctor.diagnosis import machine_faults as faults
from gpumemdoctor.recording.recording import Recording

DOUBLES = str(Path(__file__).parent / "doubles")
# The test double first, then the PYTHONPATH the tests run under (it may name the checkout).
DOUBLES_PATH = os.pathsep.join(filter(None, [DOUBLES, os.environ.get("PYTHONPATH")]))
MIB = 1 << 20
GIB = 1 << 30


def nvml_state(path: Path, processes=(), **faults_) -> None:
    state = {"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU", "total": 80 * GIB,
                       "used": sum(p["used"] for p in processes), "reserved": 0,
                       "processes": list(processes)}], **faults_}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def double_env(state: Path) -> dict:
    return {"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)}


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("gpumemdoctor: error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- NVML fails mid-run --------------------------------------------------------------------

# The target holds "GPU memory" in the test double (it writes the double's state itself, so
# the timing is its own), grows once, then breaks NVML, and runs on for 1.5 s.
NVML_TARGET = """
    import json, os, sys, time
    STATE = os.environ["GPUMEMDOCTOR_TEST_NVML"]
    FAULT = json.loads(sys.argv[1])

    def put(used, **fault):
        state = {"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU", "total": 80 << 30,
                           "used": used, "reserved": 0,
                           "processes": [{"pid": os.getpid(), "used": used}]}], **fault}
        with open(STATE + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(STATE + ".tmp", STATE)

    put(1 << 30)
    time.sleep(0.6)
    put(3 << 29)
    time.sleep(0.6)
    put(3 << 29, **FAULT)
    time.sleep(1.5)
    if FAULT.pop("recover", False):
        put(3 << 29)
        time.sleep(0.8)
    print("still running", flush=True)
    sys.exit(3)
"""

NVML_FAULTS = {
    "unknown error on every call": ({"error": 999}, "error 999"),
    "GPU lost": ({"lost": [0]}, "error 15"),
    "driver gone on every call": ({"error": 9}, "NVML stopped working"),
    "an outage that ends": ({"error": 10, "recover": True}, "error 10"),
}


@pytest.mark.parametrize("case", list(NVML_FAULTS))
def test_nvml_failing_mid_run_the_run_goes_on_and_the_report_says_from_when(cli, script, tmp_path, case):
    fault, error = NVML_FAULTS[case]
    state = tmp_path / "nvml.json"
    nvml_state(state)
    script(tmp_path, "t.py", NVML_TARGET)
    result = cli("run", "-o", "r.json", "t.py", json.dumps(fault), cwd=tmp_path, env=double_env(state))
    assert result.returncode == 3, result.stderr
    assert result.stdout == "still running\n"
    assert "gpumemdoctor: error" not in result.stderr and "Traceback" not in result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (failure,) = report["recording"]["nvml_failures"]
    assert failure["device"] == 0 and error in failure["error"]
    # the fault is written 1.2 s after the target starts and lasts 1.5 s before it recovers or the
    # target exits (a loaded machine may start the target late: the bound is from its end)
    assert 0.9 < failure["from_t"] < report["target"]["duration_s"] - 1.0 and failure["failed_calls"] >= 1
    if fault.get("recover"):
        assert failure["to_t"] is not None and failure["to_t"] > failure["from_t"] + 1.0
    else:
        assert failure["to_t"] is None
    pid = report["target"]["pid"]
    (series,) = [s for s in report["recording"]["nvml"] if s["pid"] == pid]
    used = [u for t, u in series["points"] if t < failure["from_t"]]
    assert used[0] == GIB and used[-1] == 3 * GIB // 2
    # The outage is not read as "the process freed its memory".
    assert all(u for t, u in series["points"])
    assert any(n.startswith("NVML failed on GPU 0 from") for n in report["notes"])
    assert "NVML failed on GPU 0 from" in result.stderr
    assert report["verdict"] == "clean"  # judged on what was measured before the failure
    (breakdown,) = report["breakdown"]
    assert breakdown["nvml_bytes"] == 3 * GIB // 2


# -- the report cannot be written ----------------------------------------------------------

def test_report_folder_removed_during_the_run(cli, script, tmp_path):
    (tmp_path / "out").mkdir()
    script(tmp_path, "t.py", """
        import shutil, sys
        shutil.rmtree("out")
        print("removed it")
        sys.exit(5)
    """)
    result = cli("run", "--allow-no-gpu", "-o", "out/r.json", "t.py", cwd=tmp_path)
    assert result.returncode == 5
    assert result.stdout == "removed it\n"
    line = one_error_line(result.stderr)
    assert "cannot write the report to out/r.json: No such file or directory" in line
    assert "the exit status is the target's" in line
    assert "gpumemdoctor verdict: none" in result.stderr  # the verdict is still printed
    assert not (tmp_path / "out").exists()


def _file_size_limit(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_report_on_a_full_disk_leaves_no_half_report(cli_env, script, tmp_path):
    """The file-size limit (RLIMIT_FSIZE) makes the report's write fail midway, as a full disk
    does (EFBIG instead of ENOSPC); Python ignores SIGXFSZ, so the write just fails."""
    script(tmp_path, "t.py", "import sys\nprint('ran')\nsys.exit(4)\n")
    result = subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "--allow-no-gpu", "-o", "r.json",
                             "t.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env=cli_env(), stdin=subprocess.DEVNULL, preexec_fn=_file_size_limit(1500))
    assert result.returncode == 4, result.stderr
    assert result.stdout == "ran\n"
    line = one_error_line(result.stderr)
    assert "cannot write the report to r.json: File too large" in line
    assert "gpumemdoctor verdict:" in result.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(not os.access("/dev", os.W_OK) or not os.path.exists("/dev/full"),
                    reason="needs /dev/full in a writable /dev (the report's folder is checked first)")
def test_report_to_dev_full_is_one_line_and_the_device_stays(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('ran')\n")
    result = cli("run", "--allow-no-gpu", "--force", "-o", "/dev/full", "t.py", cwd=tmp_path)
    assert result.returncode == 0
    assert "No space left on device" in one_error_line(result.stderr)
    assert "gpumemdoctor verdict:" in result.stderr
    assert Path("/dev/full").exists()


# -- the target killed by SIGKILL while its host memory rose ----------------------------------

HOST_TARGET = """
    import os, signal, sys, time
    grow = sys.argv[1] == "grow"
    kept = []
    print("ready", flush=True)
    time.sleep(0.3)
    for _ in range(40):
        if grow:
            kept.append(b"x" * (10 << 20))  # written, so resident
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_target_killed_while_its_host_memory_rose_is_said_plainly(cli, script, tmp_path):
    script(tmp_path, "t.py", HOST_TARGET)
    result = cli("run", "--allow-no-gpu", "-o", "r.json", "t.py", "grow", cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGKILL
    report = json.loads((tmp_path / "r.json").read_text())
    (finding,) = [f for f in report["findings"] if f["kind"] == "host-memory"]
    assert finding["summary"].startswith("The target was killed by SIGKILL while its host memory rose from")
    ev = finding["evidence"]
    assert ev["last_bytes"] - ev["rise_from_bytes"] >= 100 * MIB  # over the run's second half
    assert ev["last_bytes"] - ev["start_bytes"] >= 350 * MIB
    assert len(ev["curve"]) >= 4 and ev["curve"][-1][1] == ev["last_bytes"]
    assert len(report["recording"]["host_rss"]) >= 4
    assert "warning: The target was killed by SIGKILL while its host memory rose" in result.stderr
    assert "host memory " in result.stderr  # its curve, drawn
    assert "killed by signal 9" in result.stderr


def test_a_sigkill_without_rising_host_memory_is_not_blamed_on_it(cli, script, tmp_path):
    script(tmp_path, "t.py", HOST_TARGET)
    result = cli("run", "--allow-no-gpu", "-o", "r.json", "t.py", "steady", cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGKILL
    report = json.loads((tmp_path / "r.json").read_text())
    assert not [f for f in report["findings"] if f["kind"] == "host-memory"]
    assert report["recording"]["host_rss"]


def _recording(host_rss, signal_=9, kills=None) -> Recording:
    return Recording(tool_version="t", target={"pid": 1, "signal": signal_, "exit_code": None,
                                               "cgroup_oom_kills": kills},
                     started_wall=0.0, duration_s=10.0, poll_interval_s=0.005, nvml_available=False,
                     host_rss=host_rss)


def test_host_memory_rule_on_plain_numbers():
    steady_then_killed = [(t, 2 * GIB if t > 1 else 10 * MIB, None) for t in range(20)]
    assert faults.host_memory(_recording(steady_then_killed)) is None  # kill -9 of a steady job
    rising = [(t, GIB + t * 100 * MIB, None) for t in range(20)]
    found = faults.host_memory(_recording(rising))
    assert found is not None and "most likely the kernel's out-of-memory killer" in found.summary
    assert faults.host_memory(_recording(rising, signal_=15)) is None
    counted = faults.host_memory(_recording(steady_then_killed, kills=1))
    assert counted is not None and "counted 1 out-of-memory kill(s)" in counted.summary
    assert len(faults.curve([(float(t), t) for t in range(1000)])) == faults.CURVE_POINTS


# -- the supervisor killed ----------------------------------------------------------------------

def test_supervisor_killed_the_target_runs_on_and_its_agent_file_survives(popen_cli, cli, script, tmp_path):
    marker = tmp_path / "finished.txt"
    script(tmp_path, "t.py", f"""
        import os, time
        import gpumemdoctor
        print("ready", os.getpid(), os.environ["GPUMEMDOCTOR_RUN_DIR"], flush=True)
        for _ in range(30):
            gpumemdoctor.step()
            time.sleep(0.05)
        open({str(marker)!r} + ".tmp", "w").write("finished")
        os.replace({str(marker)!r} + ".tmp", {str(marker)!r})  # seen whole or not at all
    """)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = popen_cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, env={"TMPDIR": str(tmpdir)},
                     stderr=subprocess.DEVNULL)
    line = proc.stdout.readline().decode().split()
    target, run_dir = psutil.Process(int(line[1])), Path(line[2])
    try:
        proc.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 15
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "finished"  # not harmed: no signal reached it
        target.wait(timeout=15)  # its agent writes the exit record after the marker, at exit
    finally:
        if target.is_running():
            target.kill()
    records = [json.loads(x) for x in (run_dir / f"agent-{target.pid}.jsonl").read_text().splitlines()]
    assert records[0]["type"] == "hello" and records[-1]["type"] == "exit"  # written to its end
    assert not list(tmp_path.glob("gpumemdoctor-*.json"))

    # What it left can still be made a report.
    result = cli("report", "--width", "400", "--from-run-dir", str(run_dir), "-o", "recovered.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert f"recovered from the run folder {run_dir}" in text and "exit status not known" in text
    assert "is still running" not in text
    report = json.loads((tmp_path / "recovered.json").read_text())
    assert report["target"]["pid"] == target.pid and report["target"]["exit_code"] is None
    assert 1.0 < report["target"]["duration_s"] < 30
    (agent,) = report["recording"]["agents"]
    assert agent["exited_normally"] and agent["explicit_steps"] and agent["steps"] == 30
    assert cli("report", "recovered.json", cwd=tmp_path).returncode == 0


def test_report_from_run_dir_bad_input_is_one_line(cli, tmp_path):
    for args, code, expected in ((["--from-run-dir", str(tmp_path)], 2, "not a gpumemdoctor run folder"),
                                 (["--from-run-dir", str(tmp_path / "nope")], 2, "is not a folder"),
                                 ([], 2, "give a report file, or --from-run-dir"),
                                 (["x.json", "-o", "y.json"], 2, "-o goes with --from-run-dir")):
        result = cli("report", *args, cwd=tmp_path)
        assert result.returncode == code and expected in one_error_line(result.stderr)
    (tmp_path / "run.json").write_text('{"schema": "something else"}')
    result = cli("report", "--from-run-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 4 and "not a run file" in one_error_line(result.stderr)


def _run_folder(folder: Path) -> tuple[Path, float]:
    """A run folder as a killed supervisor leaves it: the run file and the target's agent file, from the
    hand-built leak's recording (tests/test_properties.py writes its lines). Its agent file's path, and
    the run's length by the records' times."""
    from .test_properties import _agent_lines, _run_file
    from .test_report_parse import make_recording

    recording = make_recording()
    (folder / "run.json").write_text(json.dumps(_run_file(recording)))
    agent = folder / f"agent-{recording.target_pid}.jsonl"
    agent.write_text("".join(json.dumps(line) + "\n" for line in _agent_lines(recording)))
    return agent, recording.duration_s


@pytest.mark.parametrize("bad, what", [
    ("garbage here", "line 3: not JSON"),
    ('{"type": "s", "t": NaN, "by": "step", "step": 1, "d": []}', "line 3: not JSON (NaN is not allowed)"),
    ('{"type": "s", "t": 1001.0, "by": "step", "step": 1, "d": [[0, Infinity, 1, 1, 1, 1]]}', "line 3: not JSON"),
    ('[1, 2]', "line 3: not a JSON object"),
    ('{"type": "s", "t": 1001.0, "by": "step", "step": "one", "d": []}', "line 3: not a valid 's' record"),
])
def test_report_from_run_dir_refuses_an_agent_file_that_is_not_valid(cli, tmp_path, bad, what):
    """Issue 41, cause 10: NaN and lines that are not records were skipped, though the docs say exit 4."""
    agent, _ = _run_folder(tmp_path)
    lines = agent.read_text().splitlines(keepends=True)
    agent.write_text("".join([*lines[:2], bad + "\n", *lines[2:]]))
    result = cli("report", "--from-run-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 4, result.stderr
    line = one_error_line(result.stderr)
    assert f"{tmp_path} is not a valid run folder: {agent.name}, {what}" in line, line


def test_report_from_run_dir_skips_the_last_line_cut_short(cli, tmp_path):
    """A process killed mid-write leaves its last line without its end: that one line is skipped."""
    agent, _ = _run_folder(tmp_path)
    agent.write_text(agent.read_text() + '{"type": "s", "t": 10')
    result = cli("report", "--from-run-dir", str(tmp_path), "--width", "120", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_report_from_run_dir_takes_the_runs_length_from_its_records(cli, tmp_path):
    """Issue 41, cause 11: the length was the agent file's modification time less the start, so a `touch`
    (or a copy) made a 1.5 s run "ran 618.9 s"."""
    agent, duration = _run_folder(tmp_path)
    later = time.time() + 600
    os.utime(agent, (later, later))
    result = cli("report", "--from-run-dir", str(tmp_path), "-o", "r.json", "--width", "120", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["target"]["duration_s"] == pytest.approx(duration)
    assert f"ran {duration:.1f} s" in result.stdout


# -- watch --jsonl for hours -----------------------------------------------------------------------

def test_watch_jsonl_is_written_line_by_line_while_watching(popen_cli, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state = tmp_path / "nvml.json"
    nvml_state(state, [{"pid": sleeper.pid, "used": GIB}])
    log = tmp_path / "w.jsonl"
    try:
        proc = popen_cli("watch", "--pid", str(sleeper.pid), "--interval", "0.05", "--duration", "30",
                         "--no-tui", "--jsonl", str(log), cwd=tmp_path, env=double_env(state))
        seen = []
        deadline = time.monotonic() + 20
        while len(seen) < 3 and time.monotonic() < deadline:  # what `tail -f` would see
            text = log.read_text() if log.exists() else ""
            if text and not text.endswith("\n"):
                pytest.fail("a line was visible before its end")
            seen = text.splitlines()
            time.sleep(0.02)
        assert len(seen) >= 3 and proc.poll() is None  # complete lines, while watch still runs
        assert [json.loads(x)["total_bytes"] for x in seen[:3]] == [GIB] * 3
    finally:
        sleeper.kill()
        sleeper.wait()


def test_watch_memory_stays_bounded_over_a_long_watch(monkeypatch):
    """A day of 1-second samples through the real Watcher (NVML and psutil answered in-process)."""
    from gpumemdoctor.live import watch as w

    fake_pid = 12345
    monkeypatch.setattr(w.procs, "info", lambda pid: w.procs.ProcessInfo(pid, 1, ["x"], 1.0, "u", "S", 10 * MIB))
    monkeypatch.setattr(w.procs, "same_process", lambda pid, ct: True)
    monkeypatch.setattr(w.procs, "descendants", lambda pid: [])
    monkeypatch.setattr(w.agent_socket, "query", lambda pid: None)
    used = {"now": GIB}
    monkeypatch.setattr(w.nvml, "processes", lambda device: [(fake_pid, used["now"])])
    monkeypatch.setattr(w.nvml, "memory_info",
                        lambda device: w.nvml.MemoryInfo(80 * GIB, used["now"], 80 * GIB - used["now"], 0))
    clock = {"t": 0.0}
    monkeypatch.setattr(w.time, "monotonic", lambda: clock["t"])
    watcher = w.Watcher(fake_pid, devices=[w.nvml.Device(0, "GPU-0", None, "test", 80 * GIB)])
    for i in range(86_400):
        clock["t"] = float(i)
        used["now"] = GIB + (i // 60) * MIB // 4 + (i % 7) * 64 * MIB  # 0.25 MiB/min under a sawtooth
        watcher.sample()
    assert len(watcher.samples) == w.HISTORY
    assert watcher.totals.kept < 4000 and watcher.totals.seen == 86_400
    rate = watcher.floor_rate_per_min()
    assert rate == pytest.approx(MIB / 4, rel=0.2)  # the day's slow leak, not the last hour's noise
    assert watcher.per_gpu[0].kept < 4000 and watcher.per_gpu[0].seen == 86_400
    full = watcher.time_to_full(rate)  # the GPU's own floor is the total's: one GPU
    assert full.gpu == 0 and full.seconds == pytest.approx((80 * GIB - used["now"]) / (rate / 60), rel=1e-6)
