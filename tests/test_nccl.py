"""NCCL's memory named, not judged as growth (gpumemdoctor/diagnosis/nccl.py, issue 29): the part of the
memory outside PyTorch that came with the process groups, on SYNTHETIC recordings built here. Their
shape follows what two H100s showed (docs/gpu-facts.md: about 588 MiB per rank outside PyTorch in a
clean 2-rank DDP job, all of it in the first moments); they are not recordings of real programs. The
recorded two-GPU runs, once there, are judged by tests/test_ranks_two_gpus.py."""
from __future__ import annotations

import copy
import io
import json

import pytest
from rich.console import Console

from gpumemdoctor.diagnosis import nccl
from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.errors import BadReportError
from gpumemdoctor.recording.recording import (AgentRecording, DeviceReading, Dist, Recording, TorchDevice,
                                              TorchSample)
from gpumemdoctor.recording.records import parse_root
from gpumemdoctor.reporters import terminal
from gpumemdoctor.app.report_file import build, parse

MIB = 1 << 20
GIB = 1 << 30
CONTEXT = 520 * MIB
PID = 5001
STEPS = 300
ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_BUFFSIZE": "4194304"}


def reading(outside: int) -> DeviceReading:
    return DeviceReading(torch_index=0, allocated_bytes=800 * MIB, active_bytes=800 * MIB,
                         reserved_bytes=GIB, requested_bytes=800 * MIB, nvml_used_bytes=CONTEXT + GIB + outside)


def groups(t: float, step: int, count: int, first: bool = False) -> dict:
    record = {"t": t, "step": step, "groups": count, "backends": ["nccl"] if count else []}
    if first:
        record.update(world_size=2, nccl_version="2.27.5", nccl_env=dict(ENV))
    return record


def rank(outside_at, group_records: list[dict], said: int | None = None) -> Recording:
    """Rank 1 of a 2-rank job on GPU 1, STEPS steps 17 ms apart after a first reading at 1.0 s:
    `outside_at(step)` outside PyTorch at each step sample (step 0: the first reading)."""
    samples = [TorchSample(t=1.0, by="first", step=0, readings=[reading(outside_at(0))])]
    for step in range(1, STEPS + 1):
        samples.append(TorchSample(t=1.0 + 0.017 * step, by="step", step=step, readings=[reading(outside_at(step))]))
    end = [reading(outside_at(STEPS))]
    probes = {phase: TorchSample(t=samples[-1].t + 0.1 * (i + 1), by=phase, step=None, readings=end)
              for i, phase in enumerate(("end", "gc", "sync", "empty_cache"))}
    root = parse_root({"groups": group_records})
    parts = {"process_groups": {"groups": group_records[-1]["groups"] if group_records else 0, "nccl_bytes": said}}
    agent = AgentRecording(pid=PID, ppid=5000, argv=["train.py"], cuda_t=0.9, allocator_backend="native",
                           devices=[TorchDevice(index=0, uuid="GPU-1", pci_bus_id=None, name="GPU", nvml_index=1)],
                           samples=samples, probes=probes, steps=STEPS, exited_normally=True, root=root,
                           exit_info={"parts": parts}, dist=Dist(rank=1, local_rank=1, world_size=2, source="torch"))
    launcher = AgentRecording(pid=5000, ppid=1, argv=["-m", "torch.distributed.run"], exited_normally=True)
    nvml = {(PID, 1): [(s.t, s.readings[0].nvml_used_bytes) for s in samples]}
    return Recording(tool_version="test", target={"pid": 5000, "argv": ["-m", "torch.distributed.run"]},
                     started_wall=0.0, duration_s=8.0, poll_interval_s=0.005, nvml_available=True, nvml=nvml,
                     agents=[launcher, agent], host="node-a")


def clean_ddp(step: int) -> int:
    """DDP with NCCL: the communicator at DDP's first broadcast, the ring's buffers at the first
    all-reduce, then flat: 588 MiB, as each rank showed on two H100s."""
    return 0 if step == 0 else 400 * MIB if step == 1 else 588 * MIB


ARRIVED = [groups(1.005, 0, 1, first=True)]  # seen at the sample right after the first allocation


def test_a_clean_nccl_job_is_clean_with_nccls_memory_named():
    d = diagnose(rank(clean_ddp, ARRIVED))
    assert d.verdict == "clean", [f.summary for f in d.findings]
    (b,) = d.breakdowns
    assert (b.non_torch_bytes, b.non_torch_nccl_bytes, b.non_torch_warmup_bytes, b.non_torch_rest_bytes) == (
        588 * MIB, 588 * MIB, 0, 0)
    assert b.nccl is True and b.nccl_env == ENV
    assert [(r.rank, r.verdict) for r in d.ranks] == [(1, "clean")]


def test_without_the_groups_record_the_same_memory_is_the_false_alarm_of_issue_29():
    """A recording from before issue 29 (no `groups` records): 588 MiB outside PyTorch is over the
    512 MiB allowance, the non-torch finding every NCCL job got on two H100s."""
    d = diagnose(rank(clean_ddp, []))
    assert d.verdict == "non-torch"
    assert "more than CUDA libraries take" in d.findings[0].summary and d.breakdowns[0].non_torch_nccl_bytes is None


def test_what_came_before_the_groups_is_not_nccls():
    """cuBLAS's kernels loaded before the process group came up (64 MiB): in warm-up, not NCCL's."""
    early = [groups(1.0 + 0.017 * 5 + 0.001, 5, 1, first=True)]  # seen after step 5
    d = diagnose(rank(lambda s: 0 if s == 0 else 64 * MIB if s <= 5 else 652 * MIB, early))
    (b,) = d.breakdowns
    assert (b.non_torch_nccl_bytes, b.non_torch_warmup_bytes, b.non_torch_rest_bytes) == (588 * MIB, 64 * MIB, 0)
    assert d.verdict == "clean"


def test_nccls_own_figure_at_exit_is_the_least_its_part_is():
    """Part of NCCL's memory came before the first allocation (in the context's figure) or with
    other libraries' first loads; where NCCL said at exit what its communicators hold, its part is at
    least that."""
    early = [groups(1.0 + 0.017 * 5 + 0.001, 5, 1, first=True)]
    d = diagnose(rank(lambda s: 0 if s == 0 else 200 * MIB if s <= 5 else 300 * MIB, early, said=250 * MIB))
    (b,) = d.breakdowns
    assert (b.non_torch_nccl_bytes, b.non_torch_warmup_bytes, b.non_torch_rest_bytes) == (250 * MIB, 50 * MIB, 0)


def test_groups_that_come_late_take_their_part_out_of_the_rest():
    late = [groups(1.0 + 0.017 * 200 + 0.001, 200, 1, first=True)]
    d = diagnose(rank(lambda s: 0 if s == 0 else 100 * MIB if s <= 200 else 688 * MIB, late))
    (b,) = d.breakdowns
    assert (b.non_torch_nccl_bytes, b.non_torch_warmup_bytes, b.non_torch_rest_bytes) == (588 * MIB, 100 * MIB, 0)
    assert d.verdict == "clean"


def test_a_new_communicator_every_step_stays_a_finding_that_names_the_groups():
    """torch.distributed.new_group at every step, each group's communicator keeping 8 MiB: the memory
    outside PyTorch grows through the run, NCCL's or not."""
    records = [groups(1.005, 0, 1, first=True)] + [groups(1.0 + 0.017 * s + 0.001, s, 1 + s)
                                                    for s in range(1, STEPS + 1)]
    d = diagnose(rank(lambda s: 0 if s == 0 else 300 * MIB + 8 * MIB * s, records))
    assert d.verdict == "non-torch"
    (f,) = [f for f in d.findings if f.kind == "non-torch"]
    assert "kept growing past warm-up, 8.00 MiB per step" in f.summary
    assert f"process groups went from 1 when NCCL came up to {STEPS + 1}" in f.summary
    assert f.remedy.startswith("Make process groups once, outside the loop, and reuse them")
    assert f.evidence["nccl_detail"]["groups_most"] == STEPS + 1 and f.evidence["nccl_detail"]["nccl_env"] == ENV


def test_growth_with_a_steady_count_of_groups_says_what_else_grows_nccls_memory():
    records = [groups(1.005, 0, 2, first=True)]
    d = diagnose(rank(lambda s: 0 if s == 0 else 300 * MIB + 2 * MIB * s, records))
    (f,) = [f for f in d.findings if f.kind == "non-torch"]
    assert "NCCL is in use (2 process groups throughout)" in f.summary and "send/recv" in f.summary


def test_the_breakdown_shows_nccl_with_its_variables():
    rec = rank(clean_ddp, ARRIVED)
    d = diagnose(rec)
    out = io.StringIO()
    terminal.render(Console(file=out, width=120, no_color=True), rec, d, None)
    text = out.getvalue()
    assert "outside PyTorch" in text and "NCCL" in text
    assert "came with its process groups (NCCL_BUFFSIZE=4194304, NCCL_NVLS_ENABLE=0)" in text


def test_the_nccl_parts_survive_the_report_and_bad_ones_are_refused():
    rec = rank(clean_ddp, ARRIVED)
    report = json.loads(json.dumps(build(rec, diagnose(rec))))
    back_rec, back = parse(copy.deepcopy(report))
    (b,) = back.breakdowns
    assert (b.non_torch_nccl_bytes, b.nccl_env) == (588 * MIB, ENV)
    assert nccl.records(back_rec.agent(PID)) == ARRIVED and diagnose(back_rec).verdict == "clean"
    for field, bad in (("nccl_env", {"NCCL_BUFFSIZE": 4}), ("nccl_env", ["NCCL_BUFFSIZE"]),
                       ("non_torch_nccl_bytes", -1)):
        broken = copy.deepcopy(report)
        broken["breakdown"][0][field] = bad
        with pytest.raises(BadReportError):
            parse(broken)
    broken = copy.deepcopy(report)
    broken["recording"]["agents"][1]["root"]["groups"][0]["groups"] = "1"
    with pytest.raises(BadReportError):
        parse(broken)
    old = copy.deepcopy(report)  # a report from before issue 29
    for key in ("non_torch_nccl_bytes", "nccl_env"):
        del old["breakdown"][0][key]
    del old["recording"]["agents"][1]["root"]["groups"]
    _, loaded = parse(old)
    assert loaded.breakdowns[0].non_torch_nccl_bytes is None
