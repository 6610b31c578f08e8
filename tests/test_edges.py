"""Evidence at the edges (issue 32, items 5-7): a hard exit, a disabled garbage collector, the
program's own line. The agent runs over the torch test double (tests/doubles/fake_cuda.py) and in
real processes on the CPU; the recordings judged here are SYNTHETIC, built in the test (shapes
after issue 32's H100 programs), except where a test says it reads a GPU fixture."""
from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("fake_cuda", Path(__file__).parent / "doubles" / "fake_cuda.py")
fake_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_cuda)

from gpumemdoctor._agent import exit as exit_probes  # noqa: E402
from gpumemdoctor._agent.search.blocks import user_frames  # noqa: E402
from gpumemdoctor._agent.search.search import MAX_FRAMES  # noqa: E402
from gpumemdoctor.diagnosis import judgement, stacks, suspects  # noqa: E402
from gpumemdoctor.diagnosis.diagnose import diagnose  # noqa: E402
from gpumemdoctor.recording.agent_files import read_agent_file  # noqa: E402
from gpumemdoctor.recording.recording import (AgentRecording, DeviceReading, ProcessRecord, Recording,  # noqa: E402
                                              TorchDevice, TorchSample)
from gpumemdoctor.app.report_file import build, parse  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
CONTEXT = 520 * MiB
PID = 4242


@pytest.fixture
def agent_and_clock(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path), context_bytes=CONTEXT)


def records(tmp_path, agent) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / f"agent-{agent.shared.pid}.jsonl").read_text().splitlines()]


def recording_of(agent: AgentRecording, **target) -> Recording:
    nvml = {(agent.pid, 0): [(s.t, s.readings[0].nvml_used_bytes) for s in agent.samples]}
    return Recording(tool_version="test", target={"pid": agent.pid, "argv": [], **target}, started_wall=0.0,
                     duration_s=10.0, poll_interval_s=0.005, nvml_available=True, nvml=nvml, agents=[agent])


# -- 5. a hard exit loses at most one interval of evidence ----------------------------------------

def test_os_exit_writes_a_last_reading_and_the_report_says_the_end_was_not_seen(agent_and_clock, tmp_path,
                                                                               monkeypatch):
    agent, clock = agent_and_clock
    agent.shared.channel.write({"type": "hello", "pid": agent.shared.pid})  # what Agent.begin writes first
    real = []
    monkeypatch.setattr(os, "_exit", real.append)  # what the stand-in calls in the end
    exit_probes.install_hard_exit(lambda: agent)
    assert os._exit is not real.append
    for step in range(3):
        agent.shared.torch.set(64 * MiB * (step + 1), 256 * MiB)
        clock.now += 0.02
        agent.on_step(explicit=True)
    agent.shared.torch.set(2560 * MiB, 2560 * MiB)  # the leak, then os._exit at once: no sample saw it
    os._exit(3)
    assert real == [3]  # the real os._exit, with the program's status, once
    found = records(tmp_path, agent)
    (hard,) = [r for r in found if r["type"] == "hard-exit"]
    assert hard["status"] == 3 and hard["d"][0][1] == 2560 * MiB
    assert not any(r["type"] in ("exit", "p") for r in found)  # no exit probes: atexit does not run
    os._exit(4)  # a second call writes nothing more
    assert real == [3, 4] and len([r for r in records(tmp_path, agent) if r["type"] == "hard-exit"]) == 1

    rec = read_agent_file(str(tmp_path / f"agent-{agent.shared.pid}.jsonl"), 0.0)
    assert rec.hard_exit["status"] == 3 and rec.samples[-1].by == "hard-exit"
    again = AgentRecording.from_json(json.loads(json.dumps(rec.to_json())))
    assert again.hard_exit == rec.hard_exit
    d = diagnose(recording_of(again, exit_code=3))
    assert d.verdict == "unknown"
    (f,) = [f for f in d.findings if f.kind == "unknown"]
    assert f.bytes == 2560 * MiB and f.evidence["decided_by"] == "end-not-seen"
    assert "left through os._exit(3)" in f.summary and "is unknown" in f.summary
    assert any("the end of process" in n and "os._exit(3)" in n for n in d.notes)
    assert parse(json.loads(json.dumps(build(recording_of(again), d))))[1].verdict == "unknown"


def test_the_stand_in_for_os_exit_does_nothing_in_another_process(agent_and_clock, tmp_path, monkeypatch):
    agent, _ = agent_and_clock
    real = []
    monkeypatch.setattr(os, "_exit", real.append)
    exit_probes.install_hard_exit(lambda: agent)
    agent.shared.channel.write({"type": "hello", "pid": agent.shared.pid})
    path = tmp_path / f"agent-{agent.shared.pid}.jsonl"
    agent.shared.pid += 1  # as in a forked copy, whose agent is its parent's
    os._exit(0)
    assert real == [0] and [json.loads(x)["type"] for x in path.read_text().splitlines()] == ["hello"]


def test_os_exit_under_the_tool_keeps_its_status_and_flushes_nothing(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        import os, sys
        out = open(sys.argv[1], "w")
        out.write("buffered, never flushed")
        os._exit(5)
    """)
    plain = subprocess.run([sys.executable, "t.py", "plain.txt"], cwd=tmp_path, timeout=60)
    result = cli("run", "--allow-no-gpu", "t.py", "tool.txt", cwd=tmp_path, timeout=120)
    assert plain.returncode == result.returncode == 5, result.stderr
    # os._exit loses what a file object buffered, with or without the tool: nothing is flushed
    assert (tmp_path / "plain.txt").read_text() == (tmp_path / "tool.txt").read_text() == ""
    (path,) = tmp_path.glob("gpumemdoctor-*.json")
    (agent,) = json.loads(path.read_text())["recording"]["agents"]
    assert agent["hard_exit"]["status"] == 5 and agent["exited_normally"] is False


def _reading(allocated: int, nvml: int | None = None) -> DeviceReading:
    reserved = max(allocated, 20 * MiB)
    return DeviceReading(0, allocated, allocated, reserved, allocated,
                         nvml if nvml is not None else CONTEXT + reserved)


def _agent(samples: list[TorchSample], *, exited: bool = False, hard: dict | None = None,
           probes: dict | None = None) -> AgentRecording:
    return AgentRecording(pid=PID, argv=["t.py"], cuda_t=0.9, allocator_backend="native",
                          devices=[TorchDevice(index=0, uuid="GPU-0", pci_bus_id=None, name="GPU", nvml_index=0)],
                          samples=samples, probes=probes or {}, exited_normally=exited, hard_exit=hard)


def test_an_end_not_seen_after_a_flat_run_is_unknown_not_clean():
    # SYNTHETIC, after issue 32's "exiting hard one second later": 2.5 GiB allocated at once, then a
    # second of samples that saw it flat, then os._exit(0). Before: `clean`, nothing said.
    samples = [TorchSample(t=1.0 + 0.02 * i, by="time", step=None, readings=[_reading(2560 * MiB)])
               for i in range(50)]
    samples.append(TorchSample(t=2.0, by="hard-exit", step=None, readings=[_reading(2560 * MiB)]))
    d = diagnose(recording_of(_agent(samples, hard={"t": 2.0, "status": 0}), exit_code=0))
    assert d.verdict == "unknown"
    (f,) = [f for f in d.findings if f.kind == "unknown"]
    assert f.bytes == 2560 * MiB and "too short" not in f.summary  # the samples were enough: it says only why
    assert d.breakdowns[0].exit_probes is False


def test_the_same_run_ending_normally_is_judged_as_before():
    samples = [TorchSample(t=1.0 + 0.02 * i, by="time", step=None, readings=[_reading(2560 * MiB)])
               for i in range(50)]
    end = TorchSample(t=2.1, by="end", step=None, readings=[_reading(2560 * MiB)])
    probes = {"end": end, "gc": TorchSample(t=2.2, by="gc", step=None, readings=[_reading(2560 * MiB)])}
    d = diagnose(recording_of(_agent(samples, exited=True, probes=probes)))
    assert d.verdict == "clean" and [f.kind for f in d.findings if f.kind == "live-at-exit"]
    assert not any("was not seen" in n for n in d.notes)


def test_a_process_that_ended_before_its_first_reading_is_unknown_not_non_torch():
    # SYNTHETIC, after issue 32's "leaks, then os._exit() at once": the agent saw CUDA start, NVML saw
    # the process grow to 3 GiB, and no reading of PyTorch's allocator came. Before: `non-torch`,
    # "no PyTorch allocator was seen".
    agent = _agent([], hard={"t": 1.2, "status": 0})
    rec = recording_of(agent)
    rec.nvml = {(PID, 0): [(1.0, 520 * MiB), (1.1, 1536 * MiB), (1.2, 3 * GiB)]}
    d = diagnose(rec)
    assert d.verdict == "unknown" and not [f for f in d.findings if f.kind == "non-torch"]
    (f,) = d.findings
    assert f.evidence["decided_by"] == "no-reading" and f.bytes == 3 * GiB
    assert "os._exit(0)" in f.summary


def test_a_killed_process_seen_growing_is_still_a_leak():
    samples = [TorchSample(t=1.0 + 0.02 * i, by="time", step=None, readings=[_reading((i + 1) * 8 * MiB)])
               for i in range(60)]
    d = diagnose(recording_of(_agent(samples), signal=9, exit_code=None))
    assert d.verdict == "leak" and not [f for f in d.findings if f.kind == "unknown"]
    assert any("was killed by SIGKILL" in n for n in d.notes)


def test_a_process_alive_after_the_run_is_no_end_not_seen():
    samples = [TorchSample(t=1.0 + 0.02 * i, by="time", step=None, readings=[_reading(1 * GiB)]) for i in range(20)]
    rec = recording_of(_agent(samples))
    rec.target["pid"] = 1
    rec.processes = [ProcessRecord(pid=PID, ppid=1, cmdline=None, create_time=None, is_target=False,
                                   first_seen_t=1.0, alive_after_exit=True, used_after_exit_bytes={0: 1 * GiB})]
    d = diagnose(rec)
    assert not [f for f in d.findings if f.kind == "unknown"] and not any("not seen" in n for n in d.notes)


# -- 6. a disabled collector is said ----------------------------------------------------------

def test_the_samples_count_a_disabled_collector_and_the_exit_record_keeps_it(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    agent.shared.channel.write({"type": "hello", "pid": agent.shared.pid})  # what Agent.begin writes first
    agent.shared.torch.set(8 * MiB, 20 * MiB)
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            clock.now += 0.02
            agent.on_step(explicit=True)
        assert not gc.isenabled()  # the sample left the program's setting as it was
    finally:
        if was:
            gc.enable()
    clock.now += 0.02
    agent.on_step(explicit=True)
    assert agent.sampler.collector_off == 3
    exit_probes.finish(agent)
    (done,) = [r for r in records(tmp_path, agent) if r["type"] == "exit"]
    ballast = done["collector"].pop("ballast")
    assert done["collector"] == {"enabled_at_exit": was, "threshold": gc.get_threshold()[0], "off_samples": 3,
                                 "samples": 4, "count_left_higher": 0}
    assert ballast > 0
    rec = read_agent_file(str(tmp_path / f"agent-{agent.shared.pid}.jsonl"), 0.0)
    assert rec.exit_info["collector"]["off_samples"] == 3


GROWTH = {"series": "allocated", "by": "time", "grown_bytes": 2 * GiB, "start_floor_bytes": 0,
          "end_floor_bytes": 2 * GiB, "live_at_end_bytes": 0, "retained_bytes": 0, "retained_by": "released",
          "released": {"how": "gc-at-exit", "t": 5.0, "after_t": 4.9, "after_step": 0, "freed_bytes": 2 * GiB},
          "rate_bytes_per_step": None, "rate_bytes_per_s": 512 * MiB, "points": 40,
          "rate_text": "512 MiB per second (from 1.0 s)"}


def _evidence(**kw) -> judgement.Evidence:
    base = dict(pid=10, device=0, torch_index=0, where="process 10 on GPU 0", samples=200, by="time",
                enough_samples=True, unseen_bytes=0, growth=GROWTH, live_bytes=0, garbage_bytes=2 * GiB,
                exited_normally=True)
    base.update(kw)
    return judgement.Evidence(**base)


def test_cycles_piled_up_with_the_collector_disabled_are_garbage_not_a_leak():
    # SYNTHETIC, after issue 32's gc.disable() program: growth let go of only by gc.collect() at exit.
    # Before: `leak` "until the loop's last step (step 0)", a generic remedy.
    found = judgement.judge(_evidence(collector={"enabled_at_exit": False, "threshold": 700, "off_samples": 200,
                                                 "samples": 200}))
    assert [(j.kind, j.evidence["decided_by"]) for j in found] == [("garbage-cycle", "collector-disabled")]
    assert found[0].summary.startswith("The garbage collector was disabled (at exit)")
    assert "gc.enable()" in found[0].remedy and found[0].bytes == 2 * GiB


def test_with_the_collector_on_the_same_growth_is_still_a_leak():
    for collector in (None, {"enabled_at_exit": True, "threshold": 700, "off_samples": 10, "samples": 200}):
        found = judgement.judge(_evidence(collector=collector))
        assert [(j.kind, j.evidence["decided_by"]) for j in found] == [("leak", "growth")]


def test_the_collector_counts_as_off_from_half_the_samples():
    off = judgement.collector_off
    assert off({"enabled_at_exit": True, "threshold": 700, "off_samples": 100, "samples": 200})
    assert not off({"enabled_at_exit": True, "threshold": 700, "off_samples": 99, "samples": 200})
    assert off({"enabled_at_exit": True, "threshold": 0, "off_samples": 0, "samples": 200})
    assert not off(None) and not off({})


# -- 7. the line is the program's line --------------------------------------------------------

class _Recorder:
    stacks: list = []

    def __deepcopy__(self, memo):
        # innermost first, as PyTorch's history gives them
        self.stacks.append([[f.filename, f.lineno, f.name] for f in reversed(traceback.extract_stack())])
        return _Recorder()


def _deep(depth: int):
    return {"layer": _deep(depth - 1)} if depth else [_Recorder()]


def test_a_deep_copy_keeps_the_programs_line_in_the_frames_a_group_keeps():
    import copy

    _Recorder.stacks.clear()
    copy.deepcopy(_deep(8))  # the line: a real stack through copy.py's recursion
    line = sys._getframe().f_lineno - 1
    (stack,) = _Recorder.stacks
    stack = stack[1:]  # without __deepcopy__ itself, which PyTorch's tensor would be
    assert all(f[0].endswith("copy.py") for f in stack[:MAX_FRAMES])  # the cut alone kept only copy.py
    kept = user_frames(stack)[:MAX_FRAMES]
    assert kept[0][0].endswith("copy.py") and kept[0][2] == "deepcopy"  # the call the program made
    assert stacks.user_line(kept) == [__file__, line, "test_a_deep_copy_keeps_the_programs_line_in_the_frames_a_group_keeps"]


def test_frames_in_the_programs_own_folder_are_its_own_even_among_installed_packages(monkeypatch):
    main = type(sys)("__main__")
    main.__file__ = "/venv/lib/python3.12/site-packages/trainer/run.py"
    monkeypatch.setitem(sys.modules, "__main__", main)
    stack = [["/venv/lib/python3.12/site-packages/torch/_tensor.py", 1, "x"],
             ["/usr/lib/python3.12/copy.py", 143, "deepcopy"],
             ["/venv/lib/python3.12/site-packages/trainer/ema.py", 20, "update"],
             ["/venv/lib/python3.12/site-packages/trainer/run.py", 9, "<module>"]]
    assert user_frames(stack) == stack[1:]
    assert stacks.user_line(stack[1:]) == stack[2]


def _group(frames, path="__main__.buf", size=512 * MiB):
    return {"device": 0, "new": True, "bytes": size, "count": 1, "frames": frames, "thread": None,
            "holders": [{"path": path, "pattern": path, "kind": "global", "count": 1, "bytes": size, "sizes": None}],
            "unheld_bytes": 0, "unheld_count": 0, "unheld_sizes": None, "unheld_why": None}


def _search(when, t, groups, trace=True):
    return {"when": when, "t": t, "step": None if when == "exit" else 40, "trace": trace, "source": "allocator",
            "all_live": when == "exit", "candidate_bytes": sum(g["bytes"] for g in groups),
            "candidate_count": len(groups), "groups": groups, "visited": 1000, "gave_up": None, "elapsed_s": 0.1}


def test_a_tensor_that_replaces_itself_gets_the_stack_of_its_latest_allocation():
    # SYNTHETIC, after issue 32's `buf = torch.cat([buf, x])`: the search at step 40 saw the buffer's
    # block with its stack; the exit search, which holds more of it, saw it allocated after the
    # allocation history stopped. Before: the holder, and no line.
    cat = [["/work/train.py", 14, "<module>"]]
    root = {"investigations": [_search("growth", 3.0, [_group(cat, size=256 * MiB)]),
                               _search("exit", 9.0, [_group([])])]}
    (s,), meta = suspects.leak_suspects(root, 0)
    assert meta["when"] == "exit" and s["where"] == cat[0] and "at train.py:14 in <module>()" in s["summary"]
    other = {"investigations": [_search("growth", 3.0, [_group(cat, path="__main__.other")]),
                                _search("exit", 9.0, [_group([])])]}
    (s,), _ = suspects.leak_suspects(other, 0)
    assert s["where"] is None  # another holder's stack is not borrowed


# -- 3 and 4: other libraries' memory, judged over the whole run ----------------------------------

def _outside_agent(outside: list[int], *, libraries: list | None = None, exit_libraries: list | None = None,
                   arrays: list | None = None, context_extra: int = 0) -> AgentRecording:
    """SYNTHETIC: one process, time samples 0.05 s apart from 1.0 s; NVML = context (+ what another
    library held before the first reading) + reserved + `outside[i]`; a normal exit."""
    def read(held: int) -> DeviceReading:
        return DeviceReading(0, 8 * MiB, 8 * MiB, 64 * MiB, 8 * MiB, CONTEXT + context_extra + 64 * MiB + held)
    samples = [TorchSample(t=1.0 + 0.05 * i, by="time", step=None, readings=[read(y)]) for i, y in enumerate(outside)]
    end = read(outside[-1])
    probes = {p: TorchSample(t=samples[-1].t + 0.1 * (i + 1), by=p, step=None, readings=[end])
              for i, p in enumerate(("end", "gc", "sync", "empty_cache"))}
    agent = _agent(samples, exited=True, probes=probes)
    agent.root["libraries"] = libraries or []
    agent.exit_info = {"uncaught": None, "samples": len(samples), "samples_skipped": 0, "collections": None,
                       "out_of_memory": 0, "cost": {}, "parts": None, "collector": None,
                       "libraries": exit_libraries or [], "foreign_arrays": arrays or []}
    return agent


def test_memory_outside_pytorch_that_rose_and_was_let_go_of_at_the_end_is_non_torch():
    # SYNTHETIC, after issue 32's threads parking arrays: 1.35 GiB outside PyTorch, raised in steps
    # after warm-up and let go of before exit. Before: `clean` (judged only at exit, and for a
    # rise that lasts to the end).
    outside = [0] * 40 + [k * 270 * MiB for k in range(1, 6) for _ in range(6)] + [1350 * MiB] * 20 + [0] * 10
    agent = _outside_agent(outside, libraries=[{"t": 0.5, "name": "cupy"}],
                           arrays=[["cupy._core.core.ndarray", 3, 96 * MiB]])
    d = diagnose(recording_of(agent))
    assert d.verdict == "non-torch"
    (f,) = [f for f in d.findings if f.kind == "non-torch"]
    assert f.evidence["decided_by"] == "peak" and f.bytes == 1350 * MiB
    assert "let go of at the end still grew" in f.summary and "CuPy (imported at 0.5 s)" in f.summary
    assert "3 ndarray of cupy (96.0 MiB)" in f.summary and "free_all_blocks" in f.remedy


def test_a_rise_below_the_allowance_or_a_single_reading_is_not_non_torch():
    small = [0] * 20 + [400 * MiB] * 30 + [0] * 10
    spike = [0] * 40 + [2048 * MiB] * 3 + [0] * 20  # fewer readings than PEAK_READINGS in a row
    for outside in (small, spike):
        assert diagnose(recording_of(_outside_agent(outside))).verdict == "clean"


def test_xlas_pool_set_aside_before_pytorch_is_not_the_context():
    # SYNTHETIC, after issue 32's JAX program: XLA preallocated 59 GiB before PyTorch's first
    # allocation. Before: "CUDA context 59.9 GiB".
    pool = {"name": "jax", "device": 0, "bytes": 59 * GiB, "field": "pool_bytes", "in_use_bytes": 2 * MiB}
    agent = _outside_agent([0] * 40, libraries=[{"t": 0.4, "name": "jax"}], exit_libraries=[pool],
                           context_extra=59 * GiB)
    d = diagnose(recording_of(agent))
    b = d.breakdowns[0]
    assert b.context_bytes == CONTEXT and b.non_torch_libraries == [["JAX/XLA", 59 * GiB]]
    assert b.non_torch_bytes == 59 * GiB and b.non_torch_warmup_bytes == 0
    assert d.verdict == "clean"  # a library's own pool informs; it is no growth and no leak
    (f,) = [f for f in d.findings if f.kind == "library-memory"]
    assert f.bytes == 59 * GiB and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in f.remedy
    assert "not counted as the context" in f.summary
    again = parse(json.loads(json.dumps(build(recording_of(agent), d))))[1]
    assert again.breakdowns[0].non_torch_libraries == [["JAX/XLA", 59 * GiB]]


def test_a_library_imported_after_the_first_allocation_leaves_the_context_alone():
    pool = {"name": "jax", "device": 0, "bytes": 12 * GiB, "field": "pool_bytes", "in_use_bytes": 0}
    agent = _outside_agent([0] * 20 + [12 * GiB] * 20, libraries=[{"t": 1.5, "name": "jax"}],
                           exit_libraries=[pool])
    d = diagnose(recording_of(agent))
    assert d.breakdowns[0].context_bytes == CONTEXT and d.verdict == "clean"
    assert [f.kind for f in d.findings if f.kind in ("library-memory", "non-torch")] == ["library-memory"]


def test_the_agent_sees_a_gpu_library_imported_without_changing_it(cli, script, tmp_path):
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text("LOADED_BY = __loader__.__class__.__name__\n")
    script(tmp_path, "t.py", """
        import numba
        print(numba.LOADED_BY, type(numba.__spec__.loader).__name__)
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Notifying" not in result.stdout  # the library sees its own loader
    (path,) = tmp_path.glob("gpumemdoctor-*.json")
    (agent,) = json.loads(path.read_text())["recording"]["agents"]
    assert [x["name"] for x in agent["root"]["libraries"]] == ["numba"]
    assert agent["exit_info"]["libraries"] == [] and agent["exit_info"]["foreign_arrays"] == []


class _DeviceArray:  # the shape of a Numba or CuPy array, as its __cuda_array_interface__ tells it
    __cuda_array_interface__ = property(lambda self: {"shape": (1024, 256), "typestr": "<f4", "data": (0, False),
                                                      "version": 3})


def test_other_libraries_arrays_are_found_by_their_interface():
    from gpumemdoctor._agent.readings.libraries import foreign_arrays

    kept = [[_DeviceArray()] for _ in range(3)]  # in lists: instances are tracked through them
    found = {name: (count, size) for name, count, size in foreign_arrays()}
    assert found[f"{__name__}._DeviceArray"] == (3, 3 * 1024 * 256 * 4)
    del kept


# -- the GPU recordings of the scenarios of issue 32, rows 3-9 (skipped until recorded) ----------

REPORTS = Path(__file__).parent / "fixtures" / "reports"


def recorded(name: str):
    path = REPORTS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name}.json is not recorded yet (tests/fixtures/reports/PENDING.txt)")
    report = json.loads(path.read_text())
    rec = Recording.from_json(report["recording"])
    return rec, diagnose(rec)


def _target_findings(d, rec, kind):
    return [f for f in d.findings if f.kind == kind and f.pid == rec.target_pid]


def test_recorded_parked_arrays_grew_outside_pytorch_and_name_cupy():
    rec, d = recorded("non_torch_parked_arrays")
    (f,) = _target_findings(d, rec, "non-torch")
    assert f.bytes >= 1024 * MiB and "CuPy" in f.summary


def test_recorded_jax_pool_is_not_the_context():
    rec, d = recorded("library_jax_preallocated")
    b = next(b for b in d.breakdowns if b.pid == rec.target_pid)
    assert b.context_bytes < 1200 * MiB and b.non_torch_libraries
    (f,) = _target_findings(d, rec, "library-memory")
    assert f.bytes >= 8 * GiB and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in f.remedy


@pytest.mark.parametrize("name", ["hard_exit_at_once", "hard_exit_after_a_second"])
def test_recorded_hard_exits_say_the_end_was_not_seen(name):
    rec, d = recorded(name)
    assert rec.agent(rec.target_pid).hard_exit is not None
    (f,) = _target_findings(d, rec, "unknown")
    assert f.bytes >= 2 * GiB and "os._exit(0)" in f.summary
    assert any("was not seen" in n for n in d.notes)


def test_recorded_disabled_collector_is_the_cause():
    rec, d = recorded("garbage_collector_disabled")
    (f,) = _target_findings(d, rec, "garbage-cycle")
    assert f.evidence["cause"] == "collector-disabled" and "gc.enable()" in f.remedy
    assert not _target_findings(d, rec, "leak")


@pytest.mark.parametrize("name, holder", [("leak_ema_deepcopy", "__main__.ema_history[*]"),
                                          ("leak_cat_buffer", "__main__.buf")])
def test_recorded_leak_names_the_programs_line(name, holder):
    rec, d = recorded(name)
    (f,) = _target_findings(d, rec, "leak")
    top = f.suspects[0]
    line = next(i for i, text in enumerate((Path(__file__).parents[1] / "scenarios" / f"{name}.py")
                                           .read_text().splitlines(), 1) if "# allocates" in text)
    assert top["holders"][0]["pattern"].startswith(holder)
    assert top["where"] is not None and Path(top["where"][0]).name == f"{name}.py" and top["where"][1] == line


class _FakeXlaDevice:
    platform = "gpu"
    id = 0
    local_hardware_id = 0

    def __init__(self, stats):
        self._stats = stats

    def memory_stats(self):
        return self._stats


class _FakeXlaBackend:
    def __init__(self, devices):
        self._devices = devices

    def local_devices(self):
        return self._devices


def test_xlas_pool_is_read_from_the_backends_jax_made_and_kept_from_the_first_allocation(monkeypatch):
    """The pool is read from xla_bridge's backends without asking JAX for its devices (which takes
    its lock and could start one); at exit, where JAX has let its backends go, the reading made at
    PyTorch's first allocation stands. (Seen on an H100: exit's reading found no backend.)"""
    import types

    from gpumemdoctor._agent.readings import libraries

    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge._backends = {"cuda": _FakeXlaBackend([_FakeXlaDevice({"pool_bytes": 12 << 30, "bytes_in_use": 4096})])}
    jax = types.ModuleType("jax")
    jax.local_devices = lambda: pytest.fail("JAX's own device list is not asked for")
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    first = libraries.read_first_pools()
    assert first == [{"name": "jax", "device": 0, "bytes": 12 << 30, "field": "pool_bytes", "in_use_bytes": 4096}]
    bridge._backends = {}  # JAX's atexit hook has cleared them
    assert exit_probes._libraries(first)["libraries"] == first
    bridge._backends = {"cuda": _FakeXlaBackend([_FakeXlaDevice({"pool_bytes": 13 << 30})])}
    assert exit_probes._libraries(first)["libraries"][0]["bytes"] == 13 << 30  # readable at exit: exit's
    monkeypatch.delitem(sys.modules, "jax")
    monkeypatch.delitem(sys.modules, "jax._src.xla_bridge")
    assert libraries.read_first_pools() == []
