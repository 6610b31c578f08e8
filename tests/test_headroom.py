"""How long a growth had left before its GPU was full (diagnosis/headroom.py), on recordings made on a
GPU before the supervisor read the GPU's free memory: the tests give them that reading (a SYNTHETIC
figure, at the target's last sample), and check the finding's evidence and the terminal's sentence."""
from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.diagnosis.headroom import free_at
from gpumemdoctor.recording.recording import Recording
from gpumemdoctor.reporters import terminal

from .test_report_parse import make_recording

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
GIB = 1 << 30


def recorded(name: str) -> Recording:
    return Recording.from_json(json.loads((FIXTURES / f"{name}.json").read_text())["recording"])


def with_free(recording: Recording, free_bytes: int, late: float = 0.0) -> Recording:
    """The recording with GPU 0's free memory read once, `late` seconds after the target's last sample
    (or its exit probes' reading, for a run too short to sample: leak_then_raise, some runs)."""
    agent = recording.agent(recording.target_pid)
    t = (agent.samples[-1].t if agent.samples else agent.probes["end"].t) + late
    total = recording.devices[0]["total_bytes"]
    recording.device_memory = {0: [(t, total - free_bytes, free_bytes)]}
    return recording


def text_of(recording: Recording) -> str:
    out = io.StringIO()
    terminal.render(Console(file=out, width=80, no_color=True, color_system=None, highlight=False, emoji=False),
                    recording, diagnose(recording))
    return " ".join(out.getvalue().split())


def finding(recording: Recording, kind: str):
    return next(f for f in diagnose(recording).findings if f.kind == kind)


def test_a_leak_says_when_its_gpu_would_have_been_full():
    recording = with_free(recorded("leak_training_list"), 40 * GIB)
    leak = finding(recording, "leak")
    rate = next(g.rate_bytes_per_s for g in diagnose(recording).growth if g.series == "allocated")
    last = recording.agent(recording.target_pid).samples[-1].t
    assert leak.evidence["free_bytes"] == 40 * GIB and leak.evidence["free_t"] == last
    assert leak.evidence["time_to_full_s"] == pytest.approx(40 * GIB / rate, abs=1e-3)
    seconds = round(40 * GIB / rate)  # 3.9 GiB/s on the H100: about 10 s
    sentence = (f"At the end of the run ({last:.1f} s), GPU 0 had 40.0 GiB free: at "
                f"{rate / GIB:.2f} GiB/s it would have been full in about {seconds} seconds.")
    assert text_of(recording).count(sentence) == 2  # under the verdict, and in the finding


def test_without_the_gpus_free_memory_nothing_is_said():
    from tests.older import older_fixture

    recording = Recording.from_json(older_fixture("leak_training_list")["recording"])
    assert recording.device_memory == {}  # a report from before these readings: it loads all the same
    leak = finding(recording, "leak")
    assert not {"time_to_full_s", "free_bytes", "free_t"} & set(leak.evidence)
    assert "would have been full" not in text_of(recording)


def test_only_a_reading_up_to_the_last_sample_counts():
    """After its last sample the process lets go of its memory and exits: the GPU's free memory then
    says nothing of what the growth had left."""
    recording = with_free(recorded("leak_training_list"), 40 * GIB, late=0.5)
    assert "time_to_full_s" not in finding(recording, "leak").evidence
    last = recording.agent(recording.target_pid).samples[-1].t
    assert free_at(recording, 0, last + 0.4) is None and free_at(recording, 0, None) is None
    recording.device_memory[0].insert(0, (1.0, 0, None))  # NVML not answering then
    assert free_at(recording, 0, 1e9) == (recording.device_memory[0][1][0], 40 * GIB)


def test_a_full_gpu_is_already_full():
    recording = with_free(recorded("leak_training_list"), 1 << 20)
    assert finding(recording, "leak").evidence["time_to_full_s"] == 0.0
    assert "GPU 0 had 1.00 MiB free: at" in text_of(recording)
    assert "GPU 0 was already full." in text_of(recording)


def test_a_leak_not_seen_growing_says_nothing():
    """Decided by what was held at exit (the run was too short to see growth): no rate to go by."""
    recording = with_free(recorded("leak_then_raise"), 40 * GIB)
    leak = finding(recording, "leak")
    assert leak.evidence["decided_by"] == "structure" and "time_to_full_s" not in leak.evidence


def test_memory_outside_pytorch_that_grows_says_it_too():
    recording = with_free(recorded("non_torch_threads"), 10 * GIB)
    outside = finding(recording, "non-torch")
    rate = next(g.rate_bytes_per_s for g in diagnose(recording).growth if g.series == "non_torch")
    assert outside.evidence["decided_by"] == "growth" and outside.evidence["rate_bytes_per_s"] == rate
    assert outside.evidence["time_to_full_s"] == pytest.approx(10 * GIB / rate, abs=1e-3)
    assert "GPU 0 had 10.0 GiB free: at" in text_of(recording)


def test_a_growth_per_step_without_seconds_per_step_says_nothing():
    """Steps whose samples all carry one time: the run's seconds per step are not known, so the rate
    per second is not either, and no time to full is guessed."""
    recording = make_recording()
    agent = recording.agents[0]
    agent.samples = [replace(s, t=3.0) for s in agent.samples]
    leak = finding(recording, "leak")
    assert leak.evidence["decided_by"] == "growth" and leak.evidence["rate_bytes_per_step"] > 0
    assert leak.evidence["rate_bytes_per_s"] is None and "time_to_full_s" not in leak.evidence
    assert "time_to_full_s" in finding(make_recording(), "leak").evidence  # with its times, it is said


def test_a_process_seen_only_through_nvml_says_it_from_its_last_reading():
    """No agent in it (a program that is not Python, say): its NVML figure grows 8 MiB/s (SYNTHETIC)."""
    points = [(1.0 + i * 0.5, GIB + i * 4 * (1 << 20)) for i in range(40)] + [(30.0, 0)]
    recording = Recording(tool_version="test", target={"pid": 77, "argv": ["t"]}, started_wall=0.0,
                          duration_s=31.0, poll_interval_s=0.005, nvml_available=True,
                          devices=[{"index": 0, "total_bytes": 80 * GIB}], nvml={(77, 0): points},
                          device_memory={0: [(20.5, 60 * GIB, 20 * GIB), (30.0, 40 * GIB, 40 * GIB)]})
    outside = finding(recording, "non-torch")
    assert outside.evidence["free_t"] == 20.5  # the last reading while it held memory (20.5 s), not 30 s
    assert outside.evidence["rate_bytes_per_s"] == pytest.approx(8 * (1 << 20), rel=1e-6)
    assert outside.evidence["time_to_full_s"] == pytest.approx(20 * GIB / (8 * (1 << 20)), abs=1e-3)
