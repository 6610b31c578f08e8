"""app/report_file.py's parse and load: what they accept round-trips, everything else is refused.

The recording here is built by hand in the test (a made-up process whose live
tensors grow 2 MiB a step); it is input for the report code, not a measurement.
"""
from __future__ import annotations

import copy
import json
import math
import os
import stat

import pytest

from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.errors import BadReportError, UsageError
from gpumemdoctor.recording.recording import (AgentRecording, DeviceReading, ProcessRecord, Recording,
                                    TorchDevice, TorchSample)
from gpumemdoctor.app.report_file import SCHEMA, build, load, parse, write

MiB = 1 << 20
PID = 4242
CONTEXT = 500 * MiB
OTHERS = 60 << 30  # what other processes hold on the GPU


def reading(allocated: int, cache: int = 64 * MiB, pending: int = 0) -> DeviceReading:
    active = allocated + pending
    reserved = active + cache
    return DeviceReading(torch_index=0, allocated_bytes=allocated, active_bytes=active,
                         reserved_bytes=reserved, requested_bytes=allocated,
                         nvml_used_bytes=reserved + CONTEXT, allocated_peak_bytes=allocated + 300 * MiB,
                         reserved_peak_bytes=reserved + 300 * MiB)


def make_recording() -> Recording:
    """A hand-built run: one process on one GPU, live tensors growing 2 MiB a step for 40 steps."""
    samples = [TorchSample(t=1.0 + 0.1 * step, by="step", step=step,
                           readings=[reading(100 * MiB + 2 * MiB * step)])
               for step in range(1, 41)]
    end = reading(100 * MiB + 80 * MiB)
    probes = {"end": TorchSample(t=5.2, by="end", step=None, readings=[end]),
              "gc": TorchSample(t=5.3, by="gc", step=None, readings=[end], collected=12),
              "sync": TorchSample(t=5.4, by="sync", step=None, readings=[end]),
              "empty_cache": TorchSample(t=5.5, by="empty_cache", step=None,
                                         readings=[reading(180 * MiB, cache=0)])}
    agent = AgentRecording(
        pid=PID, ppid=1, argv=["train.py", "--epochs", "1"], python="3.11.7", torch_version="2.4.0",
        cuda_t=0.9, allocator_backend="native",
        devices=[TorchDevice(index=0, uuid="GPU-0000", pci_bus_id="00000000:01:00.0", name="Test GPU",
                             nvml_index=0)],
        samples=samples, probes=probes, steps=40, explicit_steps=False, exited_normally=True)
    nvml_points = [(0.9, CONTEXT)] + [(s.t, s.readings[0].nvml_used_bytes) for s in samples] + [(5.6, 0)]
    # The whole GPU (t, used, free): another job holds 60 GiB of it; the last reading comes after the
    # process let go of its memory.
    device_memory = [(t, OTHERS + used, (80 << 30) - OTHERS - used) for t, used in nvml_points[::10]]
    device_memory.append((5.6, OTHERS, (80 << 30) - OTHERS))
    return Recording(
        tool_version="0.1.0",
        target={"argv": ["train.py", "--epochs", "1"], "pid": PID, "exit_code": 0, "signal": None,
                "cwd": "/somewhere"},
        started_wall=1_700_000_000.5, duration_s=5.7, poll_interval_s=0.005, nvml_available=True,
        versions={"tool": "0.1.0", "python": "3.11.7", "torch": "2.4.0"},
        devices=[{"index": 0, "uuid": "GPU-0000", "pci_bus_id": "00000000:01:00.0", "name": "Test GPU",
                  "total_bytes": 80 << 30}],
        nvml={(PID, 0): nvml_points}, device_memory={0: device_memory},
        processes=[ProcessRecord(pid=PID, ppid=1, cmdline=["python", "train.py"], create_time=1.0e9,
                                 is_target=True, first_seen_t=0.0),
                   ProcessRecord(pid=PID + 1, ppid=PID, cmdline=["python", "-c", "worker"],
                                 create_time=1.0e9 + 1, is_target=False, first_seen_t=0.5,
                                 alive_after_exit=True, used_after_exit_bytes={0: 0})],
        agents=[agent])


@pytest.fixture(scope="module")
def built():
    recording = make_recording()
    diagnosis = diagnose(recording)
    return recording, diagnosis, build(recording, diagnosis)


def test_the_hand_built_recording_is_diagnosed_as_a_leak(built):
    _, diagnosis, report = built
    assert diagnosis.verdict == "leak"  # so the round trip below carries findings and growth
    assert {f["kind"] for f in report["findings"]} >= {"leak", "context"}
    assert report["growth"] and report["breakdown"]


def test_the_leak_says_how_long_its_gpu_had_left(built):
    """From the GPU's free memory at the process's last sample (5.0 s), not after it let go (5.6 s)."""
    recording, diagnosis, report = built
    leak = next(f for f in diagnosis.findings if f.kind == "leak")
    free = (80 << 30) - OTHERS - recording.nvml[(PID, 0)][-2][1]
    assert (leak.evidence["free_t"], leak.evidence["free_bytes"]) == (5.0, free)
    assert leak.evidence["rate_bytes_per_s"] == pytest.approx(20 * MiB)  # 2 MiB a step, 10 steps a second
    assert leak.evidence["time_to_full_s"] == pytest.approx(free / (20 * MiB), abs=1e-3)
    assert report["recording"]["device_memory"][0]["points"][-1] == [5.6, OTHERS, (80 << 30) - OTHERS]


def test_report_round_trips_through_json_and_parse(built):
    recording, diagnosis, report = built
    back_recording, back_diagnosis = parse(json.loads(json.dumps(report)))
    assert back_recording.to_json() == recording.to_json()
    assert back_recording.nvml == recording.nvml
    assert back_recording.processes == recording.processes
    assert back_recording.agents == recording.agents
    assert back_diagnosis.verdict == diagnosis.verdict
    assert back_diagnosis.findings == diagnosis.findings
    assert back_diagnosis.breakdowns == diagnosis.breakdowns
    assert back_diagnosis.growth == diagnosis.growth
    assert back_diagnosis.peaks == diagnosis.peaks
    assert back_diagnosis.notes == diagnosis.notes
    # And what came back builds the same report again.
    assert build(back_recording, back_diagnosis) == json.loads(json.dumps(report))


def test_write_then_load(built, tmp_path):
    recording, diagnosis, report = built
    path = tmp_path / "r.json"
    write(report, str(path), force=False)
    back_recording, back_diagnosis = load(str(path))
    assert back_recording.to_json() == recording.to_json()
    assert back_diagnosis.findings == diagnosis.findings
    with pytest.raises(UsageError, match="--force"):
        write(report, str(path), force=False)
    write({**report, "notes": ["again"]}, str(path), force=True)
    assert load(str(path))[1].notes == ["again"]


# -- parse refuses -------------------------------------------------------------------------

def _set(*keys_and_value):
    """A mutation that sets report[k1][k2]... to value."""
    *keys, value = keys_and_value

    def mutate(report):
        target = report
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return mutate


def _delete(*keys):
    def mutate(report):
        target = report
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return mutate


def _first_finding(kind: str):
    def index(report):
        return next(i for i, f in enumerate(report["findings"]) if f["kind"] == kind)
    return index


def _finding(field, value):
    def mutate(report):
        report["findings"][_first_finding("leak")(report)][field] = value
    return mutate


def _reading_of_first_sample(value):
    def mutate(report):
        report["recording"]["agents"][0]["samples"][0]["d"][0] = value
    return mutate


BAD = {
    "wrong schema": _set("schema", "gpumemdoctor.report/2"),
    "recording schema instead": _set("schema", "gpumemdoctor.recording/1"),
    "no schema": _delete("schema"),
    "unknown verdict": _set("verdict", "haunted"),
    "verdict not a string": _set("verdict", ["leak"]),
    "finding of unknown kind": _finding("kind", "mystery"),
    "finding bytes as string": _finding("bytes", "1048576"),
    "finding bytes as float": _finding("bytes", 1048576.0),
    "finding bytes as bool": _finding("bytes", True),
    "finding bytes NaN": _finding("bytes", math.nan),
    "finding summary missing": _finding("summary", None),
    "finding evidence a list": _finding("evidence", []),
    "findings not a list": _set("findings", {}),
    "findings missing": _delete("findings"),
    "breakdown pid as string": lambda r: r["breakdown"][0].__setitem__("pid", str(PID)),
    "breakdown size as string": lambda r: r["breakdown"][0].__setitem__("cache_bytes", "64 MiB"),
    "growth bytes None": lambda r: r["growth"][0].__setitem__("grown_bytes", None),
    "growth rate NaN": lambda r: r["growth"][0].__setitem__("rate_bytes_per_step", math.nan),
    "peak time NaN": _set("peaks", "nvml_t", math.nan),
    "peak bytes as string": _set("peaks", "nvml_bytes", "1 GiB"),
    "peaks missing": _delete("peaks"),
    "note not a string": _set("notes", [1]),
    "recording missing": _delete("recording"),
    "recording wrong schema": _set("recording", "schema", "gpumemdoctor.recording/0"),
    "target exit code as string": _set("recording", "target", "exit_code", "0"),
    "target argv not strings": _set("recording", "target", "argv", ["train.py", 1]),
    "duration NaN": _set("recording", "duration_s", math.nan),
    "nvml point of three": lambda r: r["recording"]["nvml"][0]["points"].__setitem__(0, [0.1, 1, 2]),
    "nvml point bytes as float": lambda r: r["recording"]["nvml"][0]["points"].__setitem__(0, [0.1, 1.5]),
    "device reading too short": _reading_of_first_sample([0, 1, 2]),
    "device reading with a string": _reading_of_first_sample([0, "1", 2, 3, 4, 5]),
    "sample time NaN": lambda r: r["recording"]["agents"][0]["samples"][0].__setitem__("t", math.nan),
    "unknown probe phase": lambda r: r["recording"]["agents"][0]["probes"].__setitem__(
        "later", r["recording"]["agents"][0]["probes"]["end"]),
    "agent pid missing": lambda r: r["recording"]["agents"][0].__delitem__("pid"),
    "device memory point of two": lambda r: r["recording"]["device_memory"][0]["points"].__setitem__(0, [0.1, 1]),
    "device memory free as float": lambda r: r["recording"]["device_memory"][0]["points"].__setitem__(
        0, [0.1, 1, 2.5]),
    "device memory free negative": lambda r: r["recording"]["device_memory"][0]["points"].__setitem__(
        0, [0.1, 1, -2]),
    "device memory without its device": lambda r: r["recording"]["device_memory"][0].__delitem__("device"),
    "time to full as a string": lambda r: r["findings"][_first_finding("leak")(r)]["evidence"].__setitem__(
        "time_to_full_s", "soon"),
    "free bytes as float": lambda r: r["findings"][_first_finding("leak")(r)]["evidence"].__setitem__(
        "free_bytes", 1.5),
    "process cmdline a string": lambda r: r["recording"]["processes"][0].__setitem__("cmdline", "python x"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_parse_refuses(built, case):
    report = copy.deepcopy(built[2])
    BAD[case](report)
    with pytest.raises(BadReportError):
        parse(report)


def test_each_refusal_is_of_a_valid_report(built):
    # The cases above start from a report parse accepts, so each refusal is the mutation's doing.
    parse(copy.deepcopy(built[2]))


@pytest.mark.parametrize("value", [None, "a string", 3, [], True])
def test_parse_refuses_what_is_not_an_object(value):
    with pytest.raises(BadReportError):
        parse(value)


# -- load refuses ---------------------------------------------------------------------------

def _text_of(report: dict) -> str:
    return json.dumps(report)


@pytest.mark.parametrize("make", [
    lambda r: _text_of(r)[:-10],  # cut short
    lambda r: "",
    lambda r: "not json at all",
    lambda r: _text_of(r).replace('"duration_s": 5.7', '"duration_s": NaN'),
    lambda r: _text_of(r).replace('"duration_s": 5.7', '"duration_s": Infinity'),
    lambda r: _text_of(r).replace('"duration_s": 5.7', '"duration_s": -Infinity'),
    lambda r: _text_of({**r, "schema": "other"}),
], ids=["truncated", "empty", "not-json", "NaN", "Infinity", "-Infinity", "wrong-schema"])
def test_load_refuses_bad_files_naming_the_file(built, tmp_path, make):
    text = make(built[2])
    assert text != _text_of(built[2])
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(BadReportError) as info:
        load(str(path))
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_load_refuses_a_number_that_overflows_to_infinity(built, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(_text_of(built[2]).replace('"duration_s": 5.7', '"duration_s": 1e999'))
    with pytest.raises(BadReportError):
        load(str(path))


def test_load_refuses_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b'{"schema": "\xff\xfe"}')
    with pytest.raises(BadReportError, match="UTF-8"):
        load(str(path))


def test_load_of_a_missing_file_or_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load(str(tmp_path / "missing.json"))
    with pytest.raises(UsageError, match="directory"):
        load(str(tmp_path))


def test_schema_constant():
    assert SCHEMA == "gpumemdoctor.report/1"


def test_load_refuses_deep_nesting_with_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadReportError, match="nested too deeply"):
        load(str(path))


def test_written_report_is_private_to_its_owner(tmp_path):
    path = tmp_path / "r.json"
    write({"schema": "x"}, str(path), force=False)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
