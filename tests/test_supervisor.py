"""The supervisor's tree watch on its own, with NVML and psutil answered in-process: what it keeps
stays bounded however many processes come and go, and an NVML outage is not read as memory freed.
The processes and their figures are SYNTHETIC."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpumemdoctor.errors import NoGpuError
from gpumemdoctor.system import nvml
from gpumemdoctor.supervise import supervisor, tree

GIB = 1 << 30
TARGET = 100


@pytest.fixture
def world(monkeypatch):
    """A target (PID 100) whose children come and go; NVML lists those the test says."""
    state = {"now": 1000.0, "children": [], "gpu": {}, "error": None}
    monkeypatch.setattr(tree, "time", SimpleNamespace(monotonic=lambda: state["now"], sleep=lambda s: None))
    procs = SimpleNamespace(
        info=lambda pid: None, descendants=lambda pid: list(state["children"]) if pid == TARGET else [],
        descends_from=lambda pid, ancestor: pid in state["children"] or pid in state["gpu"],
        rss=lambda pid: GIB if pid == TARGET or pid in state["children"] else None,
        same_process=lambda pid, ct: pid == TARGET or pid in state["children"])
    monkeypatch.setattr(tree, "procs", procs)

    def processes(device, strict=False):
        if state.get("fatal"):
            raise NoGpuError(state["fatal"])
        if state["error"]:
            raise nvml.CallFailed(state["error"])
        return sorted(state["gpu"].items())

    def memory_info(device):  # the whole GPU: the tree's processes and others' (state["others"])
        if state.get("fatal"):  # as nvml's own: a fatal error raises from every call
            raise NoGpuError(state["fatal"])
        if state["error"]:
            return nvml.MemoryInfo(None, None, None, None)
        used = sum(state["gpu"].values()) + state.get("others", 0)
        return nvml.MemoryInfo(device.total_bytes, used, device.total_bytes - used, 0)

    monkeypatch.setattr(tree, "nvml", SimpleNamespace(processes=processes, memory_info=memory_info))
    watch = tree.TreeWatch(TARGET, 1000.0, [nvml.Device(0, "GPU-0", None, "test", 80 * GIB)], True)

    def tick(seconds=0.6):
        state["now"] += seconds
        watch.poll()
    return state, watch, tick


def test_a_day_of_workers_with_contexts_keeps_the_watch_bounded(world):
    """144 epochs of 8 workers, each with a CUDA context: their series shrink when they end."""
    state, watch, tick = world
    pid = 1000
    for epoch in range(144):
        workers = list(range(pid, pid + 8))
        pid += 8
        state["children"] = workers
        for step in range(20):
            state["gpu"] = {TARGET: 4 * GIB + step, **{w: GIB // 2 + step * 1024 for w in workers}}
            tick()
        state["children"], state["gpu"] = [], {TARGET: 4 * GIB}
        tick()
        tick()
    ended = [k for k in watch.series if k[0] != TARGET]
    assert len(ended) == tree.MAX_ENDED_SERIES and watch.ended_dropped == 144 * 8 - tree.MAX_ENDED_SERIES
    assert all(len(watch.series[k].points()) <= 16 for k in ended)
    assert max(u for _, u in watch.series[ended[-1]].points()) == GIB // 2 + 19 * 1024  # the peak survives
    assert len(watch.members) <= tree.MAX_MEMBERS + 8
    assert any("are not kept" in n for n in watch.notes())


def test_an_nvml_outage_is_not_read_as_memory_freed(world):
    state, watch, tick = world
    state["gpu"] = {TARGET: 2 * GIB}
    tick()
    state["error"] = "GPU is lost"
    for _ in range(10):
        tick()
    state["error"] = None
    state["gpu"] = {TARGET: 3 * GIB}
    tick()
    points = watch.series[(TARGET, 0)].points()
    assert [u for _, u in points] == [2 * GIB, 3 * GIB]  # no 0 in between
    (failure,) = watch.failures
    assert failure["error"] == "GPU is lost" and failure["to_t"] == pytest.approx(failure["from_t"] + 6.0)
    assert failure["failed_calls"] == 5  # 10 polls in 6 s: tried again once a second, not at each


def test_host_memory_is_read_on_its_own_clock(world):
    state, watch, tick = world
    for _ in range(100):
        tick(0.05)
    assert 20 <= watch.host.seen <= 26  # every 0.2 s of 5 s
    assert watch.host.last[1:] == (GIB, GIB)


def test_the_gpus_free_memory_is_read_on_its_own_clock_and_left_out_in_an_outage(world):
    state, watch, tick = world
    state["gpu"], state["others"] = {TARGET: 2 * GIB}, 30 * GIB
    for _ in range(100):
        tick(0.05)
    series = watch.device_memory[0]
    assert 20 <= series.seen <= 26  # every 0.2 s of 5 s
    assert series.last[1:] == (32 * GIB, 48 * GIB)  # used by all, and free
    state["error"] = "GPU is lost"
    tick(0.6)  # the poll that finds the outage reads nothing: NVML's figures are n/a
    seen = series.seen
    for _ in range(5):
        tick(0.3)
    assert series.seen == seen  # a failing device is not read until it answers again
    assert series.last[1:] == (None, None)


def test_the_driver_gone_when_the_free_memory_is_read_is_a_failure_of_the_device(world):
    """NVML's fatal errors raise from every call. The free-memory reading, on its own clock, may be
    the first call to meet one: that is the device failing from then on, as when the process list
    meets it first, never an exception out of the poll (it stopped all NVML polling, unrecorded)."""
    state, watch, tick = world
    state["gpu"] = {TARGET: 2 * GIB}
    tick()
    state["fatal"] = "NVML stopped working (driver not loaded)"
    state["now"] += 0.6
    watch.sample_device_memory(state["now"], round(state["now"] - 1000.0, 6))  # met here first
    for _ in range(5):
        tick()
    (failure,) = watch.failures
    assert failure["error"] == state["fatal"] and failure["from_t"] == pytest.approx(1.2) and failure["to_t"] is None
    assert failure["failed_calls"] >= 2  # the process list is tried again, and fails, once a second
    state["fatal"] = None
    tick(1.0)
    assert failure["to_t"] == pytest.approx(failure["from_t"] + 4.0)


def test_a_day_of_the_gpus_free_memory_stays_bounded(world):
    state, watch, tick = world
    state["gpu"] = {TARGET: GIB}
    for i in range(20_000):
        state["others"] = (i % 7) * GIB
        tick(4.3)
    series = watch.device_memory[0]
    assert series.seen == 20_000 and len(series.points()) < 1000
    assert "device_memory gpu 0" in watch.downsampling()


def test_the_modules_to_prepare_are_imported_while_the_target_runs(tmp_path, monkeypatch):
    """RunOptions.prepare: the report's modules are imported on a thread of the supervisor while the
    target runs, so their import is not added to the run's wall time; one that fails does no harm."""
    import importlib
    import sys
    import time

    (tmp_path / "prepared_probe.py").write_text(
        "import time\nIMPORTED_AT = time.time()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "prepared_probe", raising=False)
    script = tmp_path / "target.py"
    ended = tmp_path / "ended"
    script.write_text(f"import time\ntime.sleep(1.0)\nopen({str(ended)!r}, 'w').write(repr(time.time()))\n",
                      encoding="utf-8")
    recording = supervisor.run(supervisor.RunOptions(target_args=[str(script)], measure_gpu=False,
                                                     prepare=lambda: [importlib.import_module(name) for name in
                                                                      ("prepared_probe", "no_such_module_here")]))
    assert recording.target["exit_code"] == 0
    assert sys.modules["prepared_probe"].IMPORTED_AT < float(ended.read_text(encoding="utf-8")) <= time.time()


def test_the_target_starts_before_the_supervisor_imports_what_it_watches_it_with(tmp_path):
    """What the supervisor needs only once the target runs (psutil, the recording's modules, and on a
    GPU machine pynvml: 0.2 s on an H100 machine) is imported after the target's launch, while the
    target starts: the CLI's own time before the launch is what the run loses."""
    import subprocess
    import sys

    (tmp_path / "t.py").write_text("pass\n", encoding="utf-8")
    code = (
        "import subprocess, sys\n"
        "real = subprocess.Popen.__init__\n"
        "def launch(self, *a, **k):\n"
        "    if not hasattr(sys, 'seen'):\n"
        "        sys.seen = sorted(m for m in ('psutil', 'gpumemdoctor.recording.agent_files',\n"
        "                                      'gpumemdoctor.recording.recording', 'gpumemdoctor.supervise.tree')\n"
        "                          if m in sys.modules)\n"
        "        print('BEFORE THE LAUNCH', sys.seen, file=sys.stderr, flush=True)\n"
        "    return real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = launch\n"
        "from gpumemdoctor.cli import main\n"
        "sys.argv = ['gpumemdoctor', 'run', '--allow-no-gpu', '-q', '-o', 'r.json', 't.py']\n"
        "main()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "BEFORE THE LAUNCH []" in done.stderr, done.stderr
    assert (tmp_path / "r.json").exists()


def test_nvml_that_fails_once_the_target_has_started_leaves_a_run_without_gpu_figures(tmp_path):
    """The CLI checked that NVML answers; the supervisor starts it only once the target runs. Where it
    fails then (here: no NVML at all), the target runs to its end, and the recording says why it has
    no NVML figures."""
    from gpumemdoctor.system import nvml

    if nvml.available():
        pytest.skip("NVML answers here")
    script = tmp_path / "target.py"
    script.write_text("print('ran')\n", encoding="utf-8")
    recording = supervisor.run(supervisor.RunOptions(target_args=[str(script)], measure_gpu=True))
    assert recording.target["exit_code"] == 0
    assert recording.nvml_available is False and recording.devices == []
    assert any(n.startswith("NVML could not be used once the target had started") for n in recording.notes)
