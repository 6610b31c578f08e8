"""Memory outside PyTorch (gpumemdoctor/diagnosis/non_torch.py): the breakdown's parts and the rule for calling it
growing, on SYNTHETIC recordings built here (shapes after what was measured on an H100, NOTES.md
and issue 19: not recordings of real programs) and on the recorded fixtures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumemdoctor.diagnosis import non_torch as outside
from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.growth import floor_growth, lasting_growth
from gpumemdoctor.recording.recording import AgentRecording, DeviceReading, Recording, TorchDevice, TorchSample
from gpumemdoctor.app.report_file import build, parse

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
MIB = 1 << 20
CONTEXT = 520 * MIB
PID = 4242


def reading(allocated: int, reserved: int, outside_bytes: int) -> DeviceReading:
    return DeviceReading(torch_index=0, allocated_bytes=allocated, active_bytes=allocated, reserved_bytes=reserved,
                         requested_bytes=allocated, nvml_used_bytes=CONTEXT + reserved + outside_bytes)


def recording(points: list[tuple[float, int]], *, by: str = "time", allocated=lambda i: 8 * MIB,
              exit_info: dict | None = None, cupy_pool: dict | None = None) -> Recording:
    """One process, one GPU: (x, memory outside PyTorch) per sample, x in seconds (or steps, 0.01 s
    apart), after a first reading right after the first allocation (the context's)."""
    first = TorchSample(t=1.0, by="first", step=0, readings=[reading(8 * MIB, 20 * MIB, 0)])
    samples = [first]
    for i, (x, held) in enumerate(points):
        t, step = (1.0 + x, None) if by == "time" else (1.0 + 0.01 * x, int(x))
        samples.append(TorchSample(t=t, by=by, step=step, readings=[reading(allocated(i), 64 * MIB, held)]))
    last = samples[-1].readings[0]
    end = reading(8 * MIB, 64 * MIB, last.nvml_used_bytes - CONTEXT - 64 * MIB)
    probes = {phase: TorchSample(t=samples[-1].t + 0.1 * (i + 1), by=phase, step=None, readings=[end])
              for i, phase in enumerate(("end", "gc", "sync", "empty_cache"))}
    agent = AgentRecording(pid=PID, argv=["t.py"], cuda_t=0.9, allocator_backend="native",
                           devices=[TorchDevice(index=0, uuid="GPU-0", pci_bus_id=None, name="GPU", nvml_index=0)],
                           samples=samples, probes=probes, exited_normally=True, exit_info=exit_info,
                           cupy_pool=cupy_pool)
    nvml = {(PID, 0): [(s.t, s.readings[0].nvml_used_bytes) for s in samples]}
    return Recording(tool_version="test", target={"pid": PID, "argv": ["t.py"]}, started_wall=0.0,
                     duration_s=samples[-1].t + 1, poll_interval_s=0.005, nvml_available=True, nvml=nvml,
                     agents=[agent])


def every(step_s: float, until_s: float) -> list[float]:
    return [round(step_s * i, 6) for i in range(1, int(until_s / step_s) + 1)]


def non_torch(diagnosis):
    return [f for f in diagnosis.findings if f.kind == "non-torch"]


# -- the false alarm of issue 19 ---------------------------------------------------

def varying_batches(until_s: float) -> list[tuple[float, int]]:
    """Kernels loading on first use while batches of new sizes come: 160 MiB in jumps over the first
    0.3 s (every new size can pick a kernel from a module not loaded yet), then nothing new."""
    return [(x, min(160, int(x / 0.3 * 160) // 16 * 16) * MIB) for x in every(0.02, until_s)]


def test_kernels_loaded_in_the_first_moments_of_a_short_run_are_not_called_growing():
    rec = recording(varying_batches(0.3), allocated=lambda i: (8 + 37 * i % 50) * MIB)
    xs = [s.t for s in rec.agents[0].samples[1:]]
    ys = [s.readings[0].nvml_used_bytes - CONTEXT - 64 * MIB for s in rec.agents[0].samples[1:]]
    assert floor_growth(xs, ys, 16 * MIB) is not None  # the old rule called this "kept growing"
    diagnosis = diagnose(rec)
    assert diagnosis.verdict == "clean"
    assert not non_torch(diagnosis) and not diagnosis.growth
    (note,) = [n for n in diagnosis.notes if "outside PyTorch" in n]
    assert "too short to tell growth from warm-up" in note and "0.3 s from its first allocation" in note
    b = diagnosis.breakdowns[0]
    assert b.non_torch_bytes == 160 * MIB
    assert (b.non_torch_warmup_bytes, b.non_torch_rest_bytes, b.non_torch_cupy_bytes) == (160 * MIB, 0, None)
    assert diagnosis.evidence[0]["non_torch"]["enough_after_warmup"] is False


def test_the_same_program_run_longer_is_clean_without_a_note():
    diagnosis = diagnose(recording(varying_batches(3.0)))
    assert diagnosis.verdict == "clean" and not diagnosis.growth
    assert not [n for n in diagnosis.notes if "outside PyTorch" in n]
    assert diagnosis.evidence[0]["non_torch"] == {
        # warm-up: a quarter of the 3 s from the first allocation (more than WARMUP_S)
        "warmup_end": pytest.approx(1.75), "points_after_warmup": 113, "span_after_warmup": pytest.approx(2.25),
        "enough_after_warmup": True, "growing": False}


def test_loading_that_slows_down_over_the_first_second_is_warm_up():
    # 100 MiB in ever fewer jumps over the first 1.2 s of a 4 s run: new shapes, fewer new kernels.
    points = [(x, min(100, int(100 * (x / 1.2) ** 0.5) // 4 * 4) * MIB) for x in every(0.02, 4.0)]
    diagnosis = diagnose(recording(points))
    assert diagnosis.verdict == "clean" and not diagnosis.growth


def test_a_late_one_off_rise_is_not_growth():
    # An evaluation at 80% of the run loads its own kernels once: 64 MiB, then flat.
    points = [(x, (40 if x < 3.2 else 104) * MIB) for x in every(0.02, 4.0)]
    diagnosis = diagnose(recording(points))
    assert diagnosis.verdict == "clean"
    assert diagnosis.breakdowns[0].non_torch_warmup_bytes == 40 * MIB
    assert diagnosis.breakdowns[0].non_torch_rest_bytes == 64 * MIB


# -- growth that lasts past warm-up ------------------------------------------------

def test_growth_past_warm_up_over_time_is_non_torch():
    # 64 MiB of kernels at first, then a raw allocation of 8 MiB every 0.1 s that is never freed.
    points = [(x, (64 + 8 * int(x / 0.1)) * MIB) for x in every(0.02, 3.0)]
    diagnosis = diagnose(recording(points))
    assert diagnosis.verdict == "non-torch"
    (finding,) = non_torch(diagnosis)
    assert "kept growing past warm-up" in finding.summary
    growth = next(g for g in diagnosis.growth if g.series == "non_torch")
    assert growth.rate_bytes_per_s == pytest.approx(80 * MIB, rel=0.1)
    assert growth.start_t >= 1.0 + outside.WARMUP_S
    b = diagnosis.breakdowns[0]
    assert finding.bytes == b.non_torch_rest_bytes  # what grew after warm-up
    assert finding.evidence["after_warmup"]["growing"] is True


def test_growth_past_warm_up_in_steps_is_non_torch():
    points = [(step, (100 + 2 * step) * MIB) for step in range(1, 201)]
    diagnosis = diagnose(recording(points, by="step"))
    growth = next(g for g in diagnosis.growth if g.series == "non_torch")
    assert growth.by == "step" and growth.rate_bytes_per_step == pytest.approx(2 * MIB, rel=0.05)
    assert growth.start_step >= 1 + outside.WARMUP_STEPS
    assert diagnosis.verdict == "non-torch"


def test_kernels_of_the_first_steps_are_warm_up():
    points = [(step, min(3, step) * 40 * MIB) for step in range(1, 201)]
    diagnosis = diagnose(recording(points, by="step"))
    assert diagnosis.verdict == "clean" and not diagnosis.growth
    assert diagnosis.breakdowns[0].non_torch_warmup_bytes == 120 * MIB


def test_more_than_the_allowance_is_non_torch_even_in_a_short_run():
    points = [(x, 600 * MIB) for x in every(0.02, 0.3)]
    diagnosis = diagnose(recording(points))
    assert diagnosis.verdict == "non-torch"
    (finding,) = non_torch(diagnosis)
    assert "more than CUDA libraries take" in finding.summary


def test_the_recorded_threads_scenario_still_grows_past_warm_up():
    """non_torch_threads on an H100: five 64 MiB cudaMallocs, 0.3 s apart, in a 1.7 s run."""
    report = json.loads((FIXTURES / "non_torch_threads.json").read_text())
    diagnosis = diagnose(Recording.from_json(report["recording"]))
    assert diagnosis.verdict == "non-torch"
    (finding,) = non_torch(diagnosis)
    b = diagnosis.breakdowns[0]
    assert b.non_torch_bytes == b.non_torch_warmup_bytes + b.non_torch_cupy_bytes + b.non_torch_rest_bytes
    assert b.non_torch_cupy_bytes == 0  # CuPy was imported; its pool held nothing (raw mallocs)
    # whole mallocs after warm-up (how many fell in it depends on when the first samples came: 3 or 4
    # in the H100 recordings), at least two of them: growth
    rest = b.non_torch_rest_bytes
    assert finding.bytes == rest and rest % (64 * MIB) == 0 and 2 * 64 * MIB <= rest <= 5 * 64 * MIB
    assert finding.evidence["after_warmup"]["growing"] is True


@pytest.mark.parametrize("warmup_s", [0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
def test_the_threads_call_does_not_hang_on_the_exact_warm_up(warmup_s):
    report = json.loads((FIXTURES / "non_torch_threads.json").read_text())
    agent = Recording.from_json(report["recording"]).agents[0]
    context = diagnose(Recording.from_json(report["recording"])).breakdowns[0].context_bytes
    xs = [s.t for s in agent.samples]
    ys = [s.readings[0].nvml_used_bytes - s.readings[0].reserved_bytes - context for s in agent.samples]
    assert lasting_growth(xs, ys, warmup_s, outside.MIN_SPAN_S, outside.MIN_GROWTH_BYTES).fit is not None


# -- the parts -----------------------------------------------------------------------

def test_cupy_nccl_cublas_and_graph_pools_are_itemised():
    parts = {"cublas_workspaces": [[0, 64 * MIB], [1, 32 * MIB]], "private_pools": [[0, 48 * MIB]],
             "dist_backend": "cpu:gloo,cuda:nccl", "module_loading": None}
    points = [(x, 300 * MIB) for x in every(0.02, 2.0)]
    rec = recording(points, exit_info={"parts": parts}, cupy_pool={"used_bytes": 0, "total_bytes": 256 * MIB,
                                                                   "device": 0})
    b = diagnose(rec).breakdowns[0]
    assert b.cublas_workspace_bytes == 8 * MIB  # no more than the live tensors (8 MiB here)
    assert b.private_pool_bytes == 48 * MIB and b.nccl is True
    assert (b.non_torch_cupy_bytes, b.non_torch_warmup_bytes, b.non_torch_rest_bytes) == (256 * MIB, 44 * MIB, 0)


def test_cupy_pool_on_another_device_is_not_this_ones():
    rec = recording([(x, 100 * MIB) for x in every(0.02, 2.0)],
                    cupy_pool={"used_bytes": 0, "total_bytes": 64 * MIB, "device": 1})
    b = diagnose(rec).breakdowns[0]
    assert b.non_torch_cupy_bytes is None and b.non_torch_warmup_bytes == 100 * MIB


def test_recordings_without_the_parts_get_the_outside_parts_only():
    report = json.loads((FIXTURES / "clean_adam.json").read_text())
    for agent in report["recording"]["agents"]:  # as a recording made before the parts were measured
        if agent.get("exit_info"):
            agent["exit_info"].pop("parts", None)
    b = diagnose(Recording.from_json(report["recording"])).breakdowns[0]
    assert b.cublas_workspace_bytes is None and b.private_pool_bytes is None and b.nccl is None
    assert b.non_torch_warmup_bytes == b.non_torch_bytes and b.non_torch_rest_bytes == 0


def test_every_recorded_breakdown_adds_up():
    for path in sorted(FIXTURES.glob("*.json")):
        report = json.loads(path.read_text())
        for b in diagnose(Recording.from_json(report["recording"])).breakdowns:
            if b.non_torch_warmup_bytes is not None:
                pools = sum(size for _, size in b.non_torch_libraries or [])  # XLA's pool (recorded)
                assert b.non_torch_warmup_bytes + (b.non_torch_cupy_bytes or 0) + b.non_torch_rest_bytes \
                    + (b.non_torch_nccl_bytes or 0) + pools == b.non_torch_bytes, path.stem
                assert min(b.non_torch_warmup_bytes, b.non_torch_rest_bytes, b.non_torch_nccl_bytes or 0) >= 0, path.stem


def test_the_parts_survive_the_report_and_older_reports_load():
    parts = {"cublas_workspaces": [[0, 8 * MIB]], "private_pools": [[0, 0]], "dist_backend": "nccl",
             "module_loading": "EAGER"}
    rec = recording([(x, 100 * MIB) for x in every(0.02, 2.0)], exit_info={"parts": parts})
    report = json.loads(json.dumps(build(rec, diagnose(rec))))
    _, again = parse(report)
    b = again.breakdowns[0]
    assert (b.cublas_workspace_bytes, b.private_pool_bytes, b.nccl, b.cuda_module_loading) == (8 * MIB, 0, True, "EAGER")
    assert b.non_torch_warmup_bytes == 100 * MIB
    for key in ("cublas_workspace_bytes", "private_pool_bytes", "non_torch_warmup_bytes", "non_torch_cupy_bytes",
                "non_torch_rest_bytes", "nccl", "cuda_module_loading"):
        del report["breakdown"][0][key]
    _, old = parse(report)
    assert old.breakdowns[0].non_torch_warmup_bytes is None and old.breakdowns[0].nccl is None
    report["breakdown"][0]["nccl"] = "yes"
    with pytest.raises(Exception, match="nccl"):
        parse(report)
