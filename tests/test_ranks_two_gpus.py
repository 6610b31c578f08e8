"""The two-GPU runs of issue 29, recorded on a GPU machine (tests/gpu/record_ranks.sh keeps them in
tests/fixtures/ranks_two_gpus), judged again by this version on the CPU with the checks the GPU tests
make (tests/two_gpus.py). Each test skips while its recording is absent: the recordings come from a
machine with two GPUs, never from this code."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumemdoctor.diagnosis.diagnose import diagnose, diagnose_job
from gpumemdoctor.app.report_file import build, load

from . import two_gpus

FIXTURES = Path(__file__).parent / "fixtures" / "ranks_two_gpus"
MIB = 1 << 20


def recorded(name: str) -> Path:
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"{path.relative_to(Path(__file__).parent.parent)} is not recorded yet "
                    "(tests/gpu/record_ranks.sh on a machine with two GPUs)")
    return path


def judged_now(name: str) -> dict:
    """The recording of a report, diagnosed by this version, as a report."""
    recording, _ = load(str(recorded(name)))
    return json.loads(json.dumps(build(recording, diagnose(recording))))


@pytest.mark.parametrize("name", list(two_gpus.RECORDED))
def test_a_recorded_job_of_two_gpus(name):
    two_gpus.RECORDED[name](judged_now(f"{name}.json"))


@pytest.mark.parametrize("name", list(two_gpus.JOBS))
def test_every_rank_kept_its_allocation_events(name):
    two_gpus.events_in_every_rank(judged_now(f"{name}.json"))


def test_watch_flagged_the_stray_context():
    lines = [json.loads(x) for x in recorded("watch_stray_context.jsonl").read_text().splitlines()]
    two_gpus.watch_flags(lines[-1])


def test_ps_flagged_the_stray_context():
    two_gpus.ps_flags(json.loads(recorded("ps_stray_context.json").read_text()))


def test_two_nodes_reports_are_one_job():
    recordings = [load(str(recorded(f"two_nodes_node{n}.json")))[0] for n in (0, 1)]
    two_gpus.two_nodes(diagnose_job(recordings))


def test_cuda_visible_devices_1():
    report = judged_now("cuda_visible_devices_1.json")
    agent = next(a for a in report["recording"]["agents"] if a["pid"] == report["target"]["pid"])
    assert [(d["index"], d["nvml_index"]) for d in agent["devices"]] == [(0, 1)]
    assert report["verdict"] == "leak"


# -- the checks themselves, on SYNTHETIC jobs (tests/synthetic_jobs.py): they pass on the shapes the
# runs must have, and fail on what two H100s showed before issue 29 -------------------------------

def _nccl_job(groups_records: bool):
    from gpumemdoctor.recording.records import parse_root

    from .synthetic_jobs import Rank, job

    rec = job([Rank(0), Rank(1)])
    for agent in rec.agents[1:]:
        later = {id(r): r for s in [*agent.samples, *agent.probes.values()] for r in s.readings
                 if s.step is None or s.step >= 2}  # the probes share their reading objects
        for r in later.values():
            r.nvml_used_bytes += 588 * MIB  # what each rank held outside PyTorch on two H100s
        if groups_records:
            agent.root = parse_root({"groups": [{"t": 1.15, "step": 1, "groups": 1, "backends": ["nccl"],
                                                 "world_size": 2, "nccl_version": "2.27.5",
                                                 "nccl_env": {"NCCL_NVLS_ENABLE": "0"}}]})
        key = next(k for k in rec.nvml if k[0] == agent.pid)
        rec.nvml[key] = [(s.t, s.readings[-1].nvml_used_bytes) for s in agent.samples]
    return json.loads(json.dumps(build(rec, diagnose(rec))))


def test_the_nccl_check_passes_the_named_memory_and_fails_the_false_alarm():
    two_gpus.nccl_clean(_nccl_job(groups_records=True))
    with pytest.raises(AssertionError):
        two_gpus.nccl_clean(_nccl_job(groups_records=False))  # non-torch on each rank, as on two H100s


def test_the_stray_check_passes_a_stray_context_and_fails_without_one():
    from .synthetic_jobs import Rank, job

    rec = job([Rank(0), Rank(1, stray=520 * MIB)])
    two_gpus.stray_on_gpu_0(json.loads(json.dumps(build(rec, diagnose(rec)))), reserved_there=False)
    clean = job([Rank(0), Rank(1)])
    with pytest.raises(AssertionError):
        two_gpus.stray_on_gpu_0(json.loads(json.dumps(build(clean, diagnose(clean)))), reserved_there=False)
