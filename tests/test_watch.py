"""`gpumemdoctor watch`: the judgement on plain numbers, and the real CLI over the NVML test double."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpumemdoctor.live import watch as live_watch
from gpumemdoctor.live.watch import TimeToFull, WatchSample, alerts, judgement, parse_rate
from gpumemdoctor.system import nvml

DOUBLES = str(Path(__file__).parent / "doubles")
# The test double first, then whatever PYTHONPATH the tests run under (it may name the
# checkout under test, ahead of an installed gpumemdoctor).
DOUBLES_PATH = os.pathsep.join(filter(None, [DOUBLES, os.environ.get("PYTHONPATH")]))
MIB = 1 << 20
GIB = 1 << 30


def test_parse_rate():
    assert parse_rate("64MiB/min") == 64 * MIB
    assert parse_rate("1MiB/s") == 60 * MIB
    assert parse_rate("60 MiB / h") == MIB
    for bad in ("64MiB", "fast/min", "1MiB/week"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_alerts_and_judgement():
    s = WatchSample(t=1.0, gpu_bytes={0: 2 * GIB}, rss_bytes=None, alive=True)
    assert alerts(s, None, None, None) == []
    assert len(alerts(s, None, GIB, None)) == 1
    assert alerts(s, 10 * MIB, None, 64 * MIB) == []
    assert len(alerts(s, 100 * MIB, None, 64 * MIB)) == 1
    assert judgement(None) == "not enough data yet" and judgement(0.0).startswith("flat")


def test_the_judgement_says_when_the_gpu_is_full():
    assert judgement(2 * GIB, TimeToFull(gpu=1, rate_bytes_per_s=35 * MIB, free_bytes=0, seconds=720.0)) == \
        "growing 2.00 GiB/min; at 35.0 MiB/s GPU 1 is full in about 12 minutes"
    assert judgement(2 * GIB, TimeToFull(1, 35 * MIB, 0, 0.0)) == "growing 2.00 GiB/min; at 35.0 MiB/s GPU 1 is already full"
    assert judgement(2 * GIB) == "growing 2.00 GiB/min"


@pytest.fixture
def two_gpus(monkeypatch):
    """This test process watched on two GPUs whose figures the test sets (SYNTHETIC), one sample a
    second: state["used"] and state["free"] by NVML index."""
    state = {"now": 0.0, "used": {}, "free": {}}
    monkeypatch.setattr(live_watch, "time", type("Clock", (), {"monotonic": staticmethod(lambda: state["now"])}))
    monkeypatch.setattr(live_watch.agent_socket, "query", lambda pid: None)
    monkeypatch.setattr(live_watch.nvml, "processes",
                        lambda d: [(os.getpid(), state["used"][d.index])] if d.index in state["used"] else [])
    monkeypatch.setattr(live_watch.nvml, "memory_info",
                        lambda d: nvml.MemoryInfo(80 * GIB, None, state["free"].get(d.index), None))
    watcher = live_watch.Watcher(os.getpid(), [nvml.Device(i, f"GPU-{i}", None, "test", 80 * GIB) for i in (0, 1)])

    def run(seconds, grow):  # grow: NVML index -> bytes per second
        for _ in range(seconds):
            state["now"] += 1
            for index, rate in grow.items():
                state["used"][index] = state["used"].get(index, GIB) + rate
            watcher.sample()
        return watcher.time_to_full(watcher.floor_rate_per_min())
    return state, watcher, run


def test_watch_gives_the_gpu_that_is_full_soonest(two_gpus):
    """GPU 0 grows faster, but GPU 1 has little left: GPU 1 is full first, at its own rate."""
    state, watcher, run = two_gpus
    state["free"] = {0: 40 * GIB, 1: GIB}
    full = run(40, {0: 10 * MIB, 1: 5 * MIB})
    assert full.gpu == 1 and full.free_bytes == GIB
    assert full.rate_bytes_per_s == pytest.approx(5 * MIB, rel=1e-6)
    assert full.seconds == pytest.approx(GIB / (5 * MIB), rel=1e-6)  # about 205 s
    assert watcher.samples[-1].free_bytes == {0: 40 * GIB, 1: GIB}
    state["free"] = {0: 40 * GIB, 1: None}  # NVML does not say GPU 1's: GPU 0 is what is known
    full = run(1, {0: 10 * MIB, 1: 5 * MIB})
    assert full.gpu == 0 and full.seconds == pytest.approx(40 * GIB / (10 * MIB), rel=1e-6)


def test_watch_says_no_time_to_full_while_the_floor_is_flat(two_gpus):
    state, watcher, run = two_gpus
    state["free"] = {0: GIB}
    assert run(40, {0: 0}) is None and watcher.floor_rate_per_min() == 0
    state["free"] = {0: None}
    assert run(40, {0: 10 * MIB}) is None and watcher.floor_rate_per_min() > 0  # growing, free unknown


def _write(path: Path, pid: int, used: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU",
                                         "total": 80 * GIB, "used": used, "reserved": 0,
                                         "processes": [{"pid": pid, "used": used}] if used else []}]}))
    tmp.replace(path)


def test_watch_sees_growth_and_alerts(cli, tmp_path, sleeper):
    state = tmp_path / "nvml.json"
    _write(state, sleeper.pid, 512 * MIB)
    stop = threading.Event()

    def grow():  # the watched process "leaks" 8 MiB every 50 ms (a test double's figures)
        used = 512 * MIB
        while not stop.wait(0.05):
            used += 8 * MIB
            _write(state, sleeper.pid, used)

    grower = threading.Thread(target=grow)
    grower.start()
    try:
        result = cli("watch", "--pid", str(sleeper.pid), "--interval", "0.05", "--duration", "3",
                     "--no-tui", "--jsonl", "w.jsonl", "--max-growth", "1MiB/s", "--exit-on-alert",
                     cwd=tmp_path, env={"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)})
    finally:
        stop.set()
        grower.join()
    assert result.returncode == 12, result.stderr
    assert "ALERT" in result.stdout and "an alert (--exit-on-alert)" in result.stdout
    lines = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert lines[-1]["floor_rate_bytes_per_min"] > 60 * MIB and lines[-1]["alerts"]
    # the time until the GPU is full, from its free memory (80 GiB less what the process holds),
    # read just after the process list: the grower may have written a step or two in between
    full, used = lines[-1]["time_to_full"], lines[-1]["gpu_bytes"]["0"]
    free = lines[-1]["free_bytes"]["0"]
    assert full["free_bytes"] == free and list(lines[-1]["free_bytes"]) == ["0"]
    assert (80 * GIB - used - free) % (8 * MIB) == 0 and 0 <= 80 * GIB - used - free <= 64 * MIB
    assert full["gpu"] == 0 and full["rate_bytes_per_s"] * 60 == pytest.approx(lines[-1]["floor_rate_bytes_per_min"])
    assert full["seconds"] == pytest.approx(full["free_bytes"] / full["rate_bytes_per_s"])
    assert all(line["time_to_full"] is None for line in lines if not line["floor_rate_bytes_per_min"])
    assert "; at " in result.stdout and "GPU 0 is full in about" in result.stdout


def test_watch_flat_process_and_its_exit(cli, tmp_path, sleeper):
    state = tmp_path / "nvml.json"
    _write(state, sleeper.pid, GIB)

    def end_it():  # once watch has taken enough samples to judge (its start-up takes about 0.8 s)
        log = tmp_path / "w.jsonl"
        deadline = time.monotonic() + 15
        while (not log.exists() or log.read_text().count("\n") < 12) and time.monotonic() < deadline:
            time.sleep(0.05)
        sleeper.kill()
        sleeper.wait()
        _write(state, sleeper.pid, 0)

    ender = threading.Thread(target=end_it)
    ender.start()
    result = cli("watch", "--pid", str(sleeper.pid), "--interval", "0.05", "--duration", "20",
                 "--no-tui", "--jsonl", "w.jsonl", cwd=tmp_path, env={"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)})
    ender.join()
    assert result.returncode == 0, result.stderr
    assert "flat: no sustained growth" in result.stdout
    assert f"process {sleeper.pid} exited" in result.stdout
    assert "Its GPU memory was returned to the device." in result.stdout


def test_watch_bad_input(cli, tmp_path):
    state = tmp_path / "nvml.json"
    _write(state, 1, 0)
    env = {"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)}
    missing = cli("watch", "--pid", "4000000", "--duration", "1", cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "no process with PID 4000000" in missing.stderr
    bad_rate = cli("watch", "--pid", "1", "--max-growth", "fast", cwd=tmp_path, env=env)
    assert bad_rate.returncode == 2 and "rate" in bad_rate.stderr
    no_nvml = cli("watch", "--pid", "1", "--duration", "1", cwd=tmp_path)
    assert no_nvml.returncode == 3


# A stand-in for torchrun (named torchrun, run by python): two ranks with torchrun's variables,
# started again as a torchelastic restart would (new PIDs, TORCHELASTIC_RESTART_COUNT=1) when
# the test writes `restart` into the control folder; it exits when the test writes `stop`.
FAKE_TORCHRUN = r'''
import json, os, pathlib, subprocess, sys, time
control = pathlib.Path(sys.argv[1])

def start(restart):
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                      TORCHELASTIC_RUN_ID="watch-run", TORCHELASTIC_RESTART_COUNT=str(restart)))
            for r in range(2)]

def wait_for(name):
    while not (control / name).exists():
        time.sleep(0.02)

for attempt in range(2):
    ranks = start(attempt)
    (control / f"pids-{attempt}.tmp").write_text(json.dumps([p.pid for p in ranks]))
    (control / f"pids-{attempt}.tmp").replace(control / f"pids-{attempt}.json")
    wait_for("restart" if attempt == 0 else "stop")
    for p in ranks:
        p.kill()
        p.wait()
'''


def _write_ranks(path: Path, ranks: list[int]) -> None:
    """Rank 0 on GPU 0; rank 1 on GPU 1, with a stray context on GPU 0 (figures of the test double)."""
    gpus = [{"uuid": f"GPU-test-{i}", "name": "NVML test double GPU", "total": 80 * GIB, "used": 0,
             "reserved": 0, "processes": []} for i in range(2)]
    if ranks:
        gpus[0]["processes"] = [{"pid": ranks[0], "used": GIB}, {"pid": ranks[1], "used": 300 * MIB}]
        gpus[1]["processes"] = [{"pid": ranks[1], "used": GIB}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": gpus}))
    tmp.replace(path)


def _wait_for(check, what: str, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_watch_a_launcher_follows_every_rank_and_its_restart(cli, tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    launcher_file = tmp_path / "torchrun"
    launcher_file.write_text(FAKE_TORCHRUN)
    launcher = subprocess.Popen([sys.executable, str(launcher_file), str(control)])
    state, log = tmp_path / "nvml.json", tmp_path / "w.jsonl"

    def lines():
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    def rows_of(pids):  # the samples whose rows name all of these PIDs
        return [s for s in lines() if pids <= {r["pid"] for r in s["processes"]}]

    try:
        first = _wait_for(lambda: (control / "pids-0.json").exists()
                          and json.loads((control / "pids-0.json").read_text()), "the first ranks")
        _write_ranks(state, first)
        watch = {}

        def run_watch():
            watch["result"] = cli("watch", "--pid", str(launcher.pid), "--interval", "0.1", "--duration", "40",
                                  "--no-tui", "--jsonl", str(log), cwd=tmp_path,
                                  env={"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)})

        watcher = threading.Thread(target=run_watch)
        watcher.start()
        _wait_for(lambda: len(rows_of(set(first))) >= 3, "samples of the first ranks")
        (control / "restart").write_text("")
        second = _wait_for(lambda: (control / "pids-1.json").exists()
                           and json.loads((control / "pids-1.json").read_text()), "the restarted ranks")
        _write_ranks(state, second)
        _wait_for(lambda: len(rows_of(set(second))) >= 3, "samples of the restarted ranks")
        _write_ranks(state, [])
        (control / "stop").write_text("")
        launcher.wait(timeout=20)
        watcher.join(timeout=60)
    finally:
        if launcher.poll() is None:
            for child in psutil.Process(launcher.pid).children(recursive=True):
                child.kill()
            launcher.kill()
            launcher.wait()
    result = watch["result"]
    assert result.returncode == 0, result.stderr
    assert f"process {launcher.pid} exited" in result.stdout

    for pids, restart in ((first, 0), (second, 1)):
        sample = rows_of(set(pids))[-1]
        rows = {r["pid"]: r for r in sample["processes"]}
        assert rows[pids[0]] == {"pid": pids[0], "role": "rank", "rank": 0, "local_rank": 0,
                                 "restart_count": restart, "gpu_bytes": {"0": GIB}}
        assert rows[pids[1]] == {"pid": pids[1], "role": "rank", "rank": 1, "local_rank": 1,
                                 "restart_count": restart, "gpu_bytes": {"0": 300 * MIB, "1": GIB}}
        assert sample["gpu_bytes"] == {"0": GIB + 300 * MIB, "1": GIB}
        # rank 1's 300 MiB on GPU 0, rank 0's GPU, is flagged (issue 29: shown but not flagged before)
        (flag,) = sample["flags"]
        assert {k: flag[k] for k in ("flag", "pid", "rank", "gpu", "bytes")} == {
            "flag": "stray-context", "pid": pids[1], "rank": 1, "gpu": 0, "bytes": 300 * MIB}
    assert (f"[stray-context: rank 1 PID {first[1]} holds 300 MiB on GPU 0, the GPU of rank 0 (PID {first[0]})]"
            in result.stdout)
    # and the summary names every stray context seen, the restarted ranks' too
    summary = " ".join(result.stdout.split("Watched PID")[-1].split())
    for pids in (first, second):
        assert (f"Seen: stray-context: rank 1 (PID {pids[1]}) holds 300 MiB on GPU 0, the GPU of rank 0 "
                f"(PID {pids[0]}), while it works on GPU 1" in summary)
    # the plain lines label each rank with its GPUs
    assert f"[rank 1 (local 1) PID {first[1]}: GPU0 300 MiB, GPU1 1.00 GiB]" in result.stdout
    assert f"[rank 0 (local 0) restart 1 PID {second[0]}: GPU0 1.00 GiB]" in result.stdout


def test_the_rows_of_a_job_are_drawn_with_their_rank():
    import io

    from rich.console import Console

    from gpumemdoctor.reporters import watch as reporter

    rows = [{"pid": 11, "role": "rank", "rank": 0, "local_rank": 0, "restart_count": None,
             "gpu_bytes": {0: GIB}},
            {"pid": 12, "role": "rank", "rank": 1, "local_rank": 1, "restart_count": 2, "gpu_bytes": {}},
            {"pid": 13, "role": "worker", "rank": 0, "local_rank": 0, "restart_count": None,
             "gpu_bytes": {0: 300 * MIB}}]
    s = WatchSample(t=1.0, gpu_bytes={0: GIB + 300 * MIB}, rss_bytes=None, alive=True, pids=[11, 13],
                    torch={11: [{"torch_index": 0, "allocated_bytes": MIB, "cache_bytes": 0,
                                 "pending_stream_bytes": 0, "context_bytes": 0, "non_torch_bytes": 0}]},
                    processes=rows)
    out = io.StringIO()
    console = Console(file=out, width=60, no_color=True)
    with reporter.view(console, tui=False) as show:
        show(None, s, "flat", [])
    line = out.getvalue()
    assert line.count("\n") == 1  # one line per sample, however long
    assert "[rank 0 (local 0) PID 11: GPU0 1.00 GiB]" in line
    assert "[rank 1 (local 1) restart 2 PID 12: no GPU memory yet]" in line
    assert "[worker of rank 0 (local 0) PID 13: GPU0 300 MiB]" in line
    assert "[rank 0 (local 0) PID 11 cuda:0: tensors 1.00 MiB," in line
    panel = io.StringIO()
    Console(file=panel, width=100, no_color=True).print(
        reporter._panel(type("W", (), {"samples": [s], "peak_bytes": 0, "pid": 10})(), s, "flat", []))
    assert "rank 1 (local 1) restart 2 PID 12: no GPU memory yet" in panel.getvalue()
    assert "PyTorch in rank 0 (local 0) PID 11, cuda:0:" in panel.getvalue()
    assert "holding GPU memory: PID" not in panel.getvalue()


def test_duration_ends_the_watch_whatever_the_interval(cli, tmp_path, sleeper):
    """Issue 41, cause 13: `--interval 3600 --duration 0.5` watched for an hour."""
    state = tmp_path / "nvml.json"
    _write(state, sleeper.pid, GIB)
    started = time.monotonic()
    result = cli("watch", "--pid", str(sleeper.pid), "--interval", "3600", "--duration", "0.5", "--no-tui",
                 "--jsonl", "w.jsonl", cwd=tmp_path, timeout=60,
                 env={"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(state)})
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    samples = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and 0.5 <= samples[-1]["t"] < 5  # the first, and the last at the end
    assert f"Watched PID {sleeper.pid}" in result.stdout
