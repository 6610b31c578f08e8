"""`gpumemdoctor watch`: the judgement on plain numbers, and the real CLI over the NVML test double."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpumemdoctor.watcher import WatchSample, alerts, judgement, parse_rate

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


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


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
