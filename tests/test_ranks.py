"""The ranks of a distributed job: rank identity, the rank table, stray-context, rank-imbalance, the
job, several reports merged into one, the checks per rank, the reports' names.

The jobs here are synthetic recordings built in code (tests/synthetic_jobs.py), not measurements; the
recordings of real runs in tests/fixtures/reports are checked against the same invariants, so a
real 2-GPU recording dropped in there is checked too.
"""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gpumemdoctor.diagnosis import ci_checks as checks, ranks
from gpumemdoctor.app import baseline_file
from gpumemdoctor.diagnosis.diagnose import FINDING_KINDS, VERDICTS, WARNINGS, diagnose, diagnose_job
from gpumemdoctor.errors import BadReportError
from gpumemdoctor.recording.recording import AgentRecording, DeviceReading, Dist, Recording
from gpumemdoctor.app.report_file import build, default_name, parse
from gpumemdoctor.reporters import terminal

from .synthetic_jobs import CONTEXT, GIB, MIB, Rank, job

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
# The scenarios' recordings and the multi-rank jobs' once recorded (tests/gpu/test_ranks.py keeps
# them for tests/fixtures/ranks). Not tests/fixtures/long: its report said clean under a rule that
# has changed since (its README says so).
# The two-GPU runs of issue 29 (tests/fixtures/ranks_two_gpus; its `ps --json` output is no report).
REPORTS = sorted([*FIXTURES.glob("*.json"), *(FIXTURES.parent / "ranks").glob("*.json"),
                  *(p for p in (FIXTURES.parent / "ranks_two_gpus").glob("*.json") if not p.name.startswith("ps_"))])


# Findings a rule changed after the recording takes out (the report keeps what the tool said then):
# none since the recordings of 2026-11-26.
CHANGED_SINCE: dict = {}


def kinds(diagnosis) -> list[str]:
    return [f.kind for f in diagnosis.findings]


def of_kind(diagnosis, kind):
    return [f for f in diagnosis.findings if f.kind == kind]


# -- every recorded report ----------------------------------------------------------------------

@pytest.mark.parametrize("path", REPORTS, ids=[p.stem for p in REPORTS])
def test_recorded_reports_load_and_diagnose_as_they_were(path):
    """Reports recorded before ranks existed (no host, no dist) load, and diagnose again to the
    verdict and finding kinds they hold; a recording with ranks (a real torchrun run) gets one row
    per rank process and GPU, and a job whose verdict is the report's."""
    report = json.loads(path.read_text())
    recording, _ = parse(report)
    diagnosis = diagnose(recording)
    assert diagnosis.verdict == report["verdict"]
    said = [f["kind"] for f in report["findings"] if f["kind"] not in CHANGED_SINCE.get(path.stem, ())]
    assert sorted(kinds(diagnosis)) == sorted(said)
    rank_of = ranks.rank_processes(recording)
    assert {r.pid for r in diagnosis.ranks} == set(rank_of)
    if not rank_of:
        assert diagnosis.job is None
        assert not of_kind(diagnosis, "stray-context") and not of_kind(diagnosis, "rank-imbalance")
        return
    assert diagnosis.job.verdict == diagnosis.verdict
    for row in diagnosis.ranks:
        assert row.verdict in VERDICTS and row.host == recording.host
        if row.breakdown is not None:
            b = diagnosis.breakdowns[row.breakdown]
            assert (b.pid, b.device) == (row.pid, row.device)
    for f in of_kind(diagnosis, "stray-context"):  # PyTorch reserved nothing there, or only a little
        agent = recording.agent(f.pid)
        torch_index = f.evidence["torch_index"]
        there = [r.reserved_bytes or 0 for s in agent.samples for r in s.readings if r.torch_index == torch_index]
        assert max(there, default=0) <= f.evidence["reserved_there_bytes"]
        assert f.evidence["reserved_there_bytes"] == 0 or f.evidence["owner_rank"] is not None


# -- rank identity ------------------------------------------------------------------------------

def test_the_launcher_and_a_ranks_workers_are_not_ranks():
    rec = job([Rank(0), Rank(1, workers=[2001])])
    assert sorted(ranks.rank_processes(rec)) == [1001, 1002]


def test_torchrun_under_srun_the_launcher_with_slurms_rank_is_not_a_rank():
    rec = job([Rank(0), Rank(1)])
    rec.agents[0].dist = Dist(rank=0, local_rank=0, world_size=1, source="slurm")  # the launcher, an srun task
    assert sorted(ranks.rank_processes(rec)) == [1001, 1002]
    # and srun per rank (no torchrun): the target is the rank
    alone = job([Rank(0)])
    alone.agents = [alone.agents[1]]
    alone.agents[0].ppid = 1
    assert list(ranks.rank_processes(alone)) == [1001]


# -- the clean job, and a leak on some ranks ---------------------------------------------------

def test_a_clean_two_rank_job():
    d = diagnose(job([Rank(0), Rank(1)]))
    assert d.verdict == "clean"
    assert [(r.rank, r.local_rank, r.device, r.verdict) for r in d.ranks] == [(0, 0, 0, "clean"), (1, 1, 1, "clean")]
    assert d.ranks[0].peak_reserved_bytes == 2 * GIB + 256 * MIB
    assert d.ranks[0].peak_allocated_bytes == 2 * GIB
    assert d.ranks[1].peak_nvml_bytes == 2 * GIB + 256 * MIB + CONTEXT
    assert d.job.ranks == [0, 1] and d.job.ranks_with_leak == [] and d.job.missing_ranks == []
    assert d.job.summary == "2 ranks on 1 host (node-a)"
    assert not of_kind(d, "stray-context") and not of_kind(d, "rank-imbalance") and not of_kind(d, "child-contexts")


def test_a_leak_on_rank_1_only_names_the_rank():
    d = diagnose(job([Rank(0), Rank(1, leak_per_step=16 * MIB)]))
    assert d.verdict == "leak"
    (leak,) = of_kind(d, "leak")
    assert "process 1002 (rank 1, local rank 1) on GPU 1" in leak.summary
    assert (leak.evidence["rank"], leak.evidence["local_rank"]) == (1, 1)
    assert [r.verdict for r in d.ranks] == ["clean", "leak"]
    assert d.job.ranks_with_leak == [1] and d.job.verdict == "leak"
    assert "leak on rank 1 only, of 2 ranks" in d.job.summary


def test_a_leak_on_every_rank_is_said_so():
    d = diagnose(job([Rank(0, leak_per_step=16 * MIB), Rank(1, leak_per_step=16 * MIB)]))
    assert d.job.ranks_with_leak == [0, 1]
    assert "leak on every rank (2)" in d.job.summary


# -- stray-context ------------------------------------------------------------------------------

def test_a_stray_context_on_gpu_0_from_rank_1():
    d = diagnose(job([Rank(0), Rank(1, stray=520 * MIB)]))
    (stray,) = of_kind(d, "stray-context")
    assert (stray.pid, stray.device, stray.bytes) == (1002, 0, 520 * MIB)
    ev = stray.evidence
    assert (ev["pid"], ev["rank"], ev["local_rank"], ev["device"], ev["bytes"], ev["works_on"]) == (
        1002, 1, 1, 0, 520 * MIB, [1])
    assert "torch.cuda.set_device(local_rank)" in stray.remedy and "CUDA_VISIBLE_DEVICES" in stray.remedy
    assert d.verdict == "stray-context"  # memory the program could have spared, and nothing bigger
    assert not of_kind(d, "child-contexts")
    # rank 1 has a row for each GPU it held memory on; its stray one reserved nothing
    assert [(r.rank, r.device, r.peak_reserved_bytes, r.peak_nvml_bytes) for r in d.ranks if r.rank == 1] == [
        (1, 0, 0, 520 * MIB), (1, 1, 2 * GIB + 256 * MIB, 2 * GIB + 256 * MIB + CONTEXT)]
    assert {r.verdict for r in d.ranks if r.rank == 1} == {"stray-context"}


def test_a_bigger_leak_wins_the_verdict_over_a_stray_context():
    d = diagnose(job([Rank(0), Rank(1, stray=500 * MIB, leak_per_step=32 * MIB)]))
    assert d.verdict == "leak" and of_kind(d, "stray-context")


def _probe_touched(agent, torch_index: int, held: int) -> None:
    """What the exit probes of agents before issue 29 did on every device NVML listed the process
    on: synchronize it and allocate one element there (a 2 MiB segment), so that the `sync` and
    `empty_cache` readings show PyTorch's reserved memory (and its peak) on the stray GPU."""
    for phase in ("sync", "empty_cache"):
        readings = [r for r in agent.probes[phase].readings if r.torch_index != torch_index]
        reserved = 2 * MIB if phase == "sync" else 0
        readings.insert(0, DeviceReading(torch_index=torch_index, allocated_bytes=0, active_bytes=0,
                                         reserved_bytes=reserved, requested_bytes=0,
                                         nvml_used_bytes=held + 2 * MIB, allocated_peak_bytes=512,
                                         reserved_peak_bytes=2 * MIB))
        agent.probes[phase].readings = readings


def test_a_stray_context_the_exit_probes_touched_is_still_stray():
    """Two H100s (issue 29): rank 1's context on GPU 0 was in the evidence and no finding came, because
    the exit probes had allocated one element there and the rule saw PyTorch's reservation on it."""
    rec = job([Rank(0), Rank(1, stray=520 * MIB)])
    _probe_touched(rec.agent(1002), 0, 520 * MIB)
    (stray,) = of_kind(diagnose(rec), "stray-context")
    assert (stray.pid, stray.device, stray.evidence["rank"], stray.evidence["works_on"]) == (1002, 0, 1, [1])
    assert stray.bytes >= 520 * MIB


def test_a_rank_that_reserved_a_little_on_another_ranks_gpu_holds_a_stray_context():
    """A tensor made on cuda:0 before set_device (or gloo staging a CUDA tensor there): rank 1 reserved
    2 MiB on GPU 0, rank 0's GPU, and holds a whole context there."""
    rec = job([Rank(0), Rank(1, stray=540 * MIB)])
    agent = rec.agent(1002)
    for s in [*agent.samples, agent.probes["end"]]:
        for r in s.readings:
            if r.torch_index == 0:
                r.reserved_bytes = r.reserved_peak_bytes = 2 * MIB
                r.allocated_bytes = 512
    d = diagnose(rec)
    (stray,) = of_kind(d, "stray-context")
    assert (stray.pid, stray.device, stray.bytes, stray.evidence["works_on"]) == (1002, 0, 540 * MIB, [1])
    assert stray.evidence["reserved_there_bytes"] == 2 * MIB and "rank 0's GPU" in stray.summary
    # one rank on two GPUs of its own (no other rank works there) is left alone
    alone = job([Rank(0, local_rank=1, stray=540 * MIB)])
    for s in [*alone.agent(1001).samples, alone.agent(1001).probes["end"]]:
        for r in s.readings:
            if r.torch_index == 0:
                r.reserved_bytes = r.reserved_peak_bytes = 2 * MIB
    assert not of_kind(diagnose(alone), "stray-context")


def test_no_stray_context_for_a_process_that_never_started_cuda_through_pytorch():
    rec = job([Rank(0), Rank(1, stray=500 * MIB)])
    agent = rec.agent(1002)
    agent.cuda_t = None
    assert not of_kind(diagnose(rec), "stray-context")


def test_no_stray_context_where_the_process_reserved_on_no_gpu():
    rec = job([Rank(0), Rank(1, stray=500 * MIB)])
    agent = rec.agent(1002)
    for sample in [*agent.samples, *agent.probes.values()]:
        sample.readings = [r for r in sample.readings if r.torch_index == 0]
    del rec.nvml[(1002, 1)]
    assert not of_kind(diagnose(rec), "stray-context")


def test_a_dataloader_workers_context_stays_child_contexts():
    d = diagnose(job([Rank(0), Rank(1, workers=[2001, 2002])]))
    (child,) = of_kind(d, "child-contexts")
    assert child.pid == 1002 and child.device == 1 and child.evidence["rank"] == 1
    assert sorted(p["pid"] for p in child.evidence["processes"]) == [2001, 2002]
    assert not of_kind(d, "stray-context")
    assert {r.pid for r in d.ranks} == {1001, 1002}  # the workers are not ranks
    assert d.verdict == "child-contexts"


def test_a_workers_context_on_another_gpu_is_not_a_stray_context_of_the_worker():
    rec = job([Rank(0), Rank(1, workers=[2001])])
    worker = rec.agent(2001)
    # the worker also allocated on GPU 1 (reserved there) and holds a context on GPU 0
    for s in worker.samples:
        s.readings = [s.readings[0]]
        s.readings[0].reserved_bytes = 64 * MIB
    rec.nvml[(2001, 0)] = [(1.0, CONTEXT), (5.5, 0)]
    assert not of_kind(diagnose(rec), "stray-context")


# -- rank-imbalance -----------------------------------------------------------------------------

def test_one_rank_well_above_the_others_is_a_warning():
    d = diagnose(job([Rank(0), Rank(1, extra_peak=2 * GIB), Rank(2), Rank(3)], gpus=4))
    (imb,) = of_kind(d, "rank-imbalance")
    assert imb.pid == 1002 and imb.device == 1 and imb.bytes == 2 * GIB
    assert imb.evidence["rank"] == 1 and imb.evidence["median_of_others_bytes"] == 2 * GIB + 256 * MIB
    assert imb.evidence["ranks_over"] == [1]
    assert "Rank 1's peak" in imb.summary and "rank 0" in imb.remedy
    assert d.verdict == "clean"  # a warning: it never sets the verdict
    assert "rank-imbalance" in WARNINGS and "rank-imbalance" in checks.parse_kinds("rank-imbalance")


@pytest.mark.parametrize("base, extra, expected", [
    (2 * GIB, 1 * GIB, True),  # +1 GiB, +44%: both thresholds
    (2 * GIB, 900 * MIB, False),  # +39%, but under 1 GiB
    (20 * GIB, 3 * GIB, False),  # +3 GiB, but under 20% of 20.25 GiB
    (20 * GIB, 5 * GIB, True),  # +5 GiB, +24.7%
])
def test_the_imbalance_needs_20_percent_and_1_gib(base, extra, expected):
    d = diagnose(job([Rank(0, base=base), Rank(1, base=base, extra_peak=extra)]))
    assert bool(of_kind(d, "rank-imbalance")) is expected


def test_one_rank_is_never_imbalanced():
    assert not of_kind(diagnose(job([Rank(0, extra_peak=8 * GIB)])), "rank-imbalance")


def test_imbalance_rule_directly():
    rows = [{"rank": r, "local_rank": r, "pid": 10 + r, "host": "h", "device": r, "peak_reserved_bytes": peak}
            for r, peak in enumerate([10 * GIB, 10 * GIB, 14 * GIB, 13 * GIB])]
    top, j = ranks.imbalance(rows)
    assert top["rank"] == 2 and j.evidence["ranks_over"] == [2, 3] and "Rank 3 is above the others too" in j.summary
    assert ranks.imbalance(rows[:1]) is None


# -- the report: round trip, strictness, old reports --------------------------------------------

@pytest.fixture(scope="module")
def ranked():
    rec = job([Rank(0), Rank(1, leak_per_step=16 * MIB, stray=500 * MIB)])
    d = diagnose(rec)
    return rec, d, json.loads(json.dumps(build(rec, d)))


def test_a_report_with_ranks_round_trips(ranked):
    rec, d, report = ranked
    back_rec, back = parse(copy.deepcopy(report))
    assert back_rec.host == "node-a" and back_rec.agent(1002).dist == rec.agent(1002).dist
    assert back.ranks == d.ranks and back.job == d.job and back.findings == d.findings
    assert build(back_rec, back) == report


BAD = {
    "dist rank as string": lambda r: r["recording"]["agents"][2].__setitem__("dist", {"rank": "1"}),
    "dist rank as bool": lambda r: r["recording"]["agents"][2]["dist"].__setitem__("rank", True),
    "dist rank negative": lambda r: r["recording"]["agents"][2]["dist"].__setitem__("local_rank", -1),
    "dist rank as float": lambda r: r["recording"]["agents"][2]["dist"].__setitem__("world_size", 2.0),
    "dist run id as number": lambda r: r["recording"]["agents"][2]["dist"].__setitem__("run_id", 7),
    "dist unknown source": lambda r: r["recording"]["agents"][2]["dist"].__setitem__("source", "mpich"),
    "dist a list": lambda r: r["recording"]["agents"][2].__setitem__("dist", [1, 1]),
    "host as number": lambda r: r["recording"].__setitem__("host", 3),
    "finding host as list": lambda r: r["findings"][0].__setitem__("host", ["a"]),
    "rank row pid as string": lambda r: r["ranks"][0].__setitem__("pid", "1001"),
    "rank row unknown verdict": lambda r: r["ranks"][0].__setitem__("verdict", "haunted"),
    "rank row breakdown out of range": lambda r: r["ranks"][0].__setitem__("breakdown", 99),
    "rank row peak as float": lambda r: r["ranks"][0].__setitem__("peak_reserved_bytes", 1.5),
    "ranks not a list": lambda r: r.__setitem__("ranks", {}),
    "job ranks not integers": lambda r: r["job"].__setitem__("ranks", ["0"]),
    "job summary missing": lambda r: r["job"].__delitem__("summary"),
    "job unknown verdict": lambda r: r["job"].__setitem__("verdict", "fine"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_rank_data_is_refused(ranked, case):
    report = copy.deepcopy(ranked[2])
    parse(copy.deepcopy(report))  # the valid report parses; the mutation is what is refused
    BAD[case](report)
    with pytest.raises(BadReportError):
        parse(report)


def test_a_report_without_host_ranks_and_job_still_loads(ranked):
    report = copy.deepcopy(ranked[2])
    for key in ("ranks", "job"):
        del report[key]
    del report["recording"]["host"]
    for agent in report["recording"]["agents"]:
        del agent["dist"]
    rec, d = parse(report)
    assert rec.host is None and d.ranks == [] and d.job is None


def test_new_finding_kinds_are_known():
    assert {"stray-context", "rank-imbalance"} <= set(FINDING_KINDS)
    assert "stray-context" in VERDICTS and "rank-imbalance" not in VERDICTS


# -- several reports of one job -----------------------------------------------------------------

def two_nodes():
    a = job([Rank(0), Rank(1, leak_per_step=16 * MIB)], host="node-a", world_size=4)
    b = job([Rank(2, local_rank=0), Rank(3, local_rank=1, extra_peak=3 * GIB)], host="node-b", world_size=4,
            node_rank=1, started_wall=1_700_000_000.2)
    return a, b


def test_two_nodes_with_the_same_pids_make_one_job():
    a, b = two_nodes()
    assert {r.pid for r in diagnose(a).ranks} == {r.pid for r in diagnose(b).ranks}  # PIDs repeat
    d = diagnose_job([a, b])
    assert [(r.rank, r.host, r.pid) for r in d.ranks] == [(0, "node-a", 1001), (1, "node-a", 1002),
                                                          (2, "node-b", 1001), (3, "node-b", 1002)]
    for row in d.ranks:
        b_ = d.breakdowns[row.breakdown]
        assert (b_.host, b_.pid, b_.device) == (row.host, row.pid, row.device)
    (leak,) = of_kind(d, "leak")
    assert leak.host == "node-a" and leak.evidence["rank"] == 1
    # the imbalance is across the files: rank 3 against ranks 0-2
    (imb,) = of_kind(d, "rank-imbalance")
    assert (imb.host, imb.pid, imb.evidence["rank"]) == ("node-b", 1002, 3)
    assert d.verdict == "leak" and d.job.verdict == "leak"
    assert d.job.ranks == [0, 1, 2, 3] and d.job.missing_ranks == [] and d.job.hosts == ["node-a", "node-b"]
    assert "leak on rank 1 only, of 4 ranks" in d.job.summary
    assert d.peaks["nvml_host"] in ("node-a", "node-b")
    # one node alone: the other node's ranks are missing, and no imbalance is seen within node-a
    alone = diagnose(a)
    assert alone.job.missing_ranks == [2, 3] and "ranks 2-3 are not in this report" in alone.job.summary
    assert not of_kind(alone, "rank-imbalance")


def test_one_recording_through_diagnose_job_is_diagnose():
    a, _ = two_nodes()
    assert build(a, diagnose_job([a])) == build(a, diagnose(a))


def test_the_terminal_draws_the_rank_table_within_80_columns():
    rec = job([Rank(0), Rank(1, leak_per_step=16 * MIB, stray=500 * MIB)], host="a-rather-long-host-name.example")
    out = io.StringIO()
    terminal.render(Console(file=out, width=80, no_color=True, color_system=None, highlight=False, emoji=False),
                    rec, diagnose(rec), "r.json")
    text = out.getvalue()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    table = text.split("\nRanks    ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert " ".join(table[:2]).startswith("2 ranks on 1 host (a-rather-long-host-name.example); leak on rank 1")
    rows = [line.split() for line in table if line.lstrip().startswith(("0 ", "1 "))]
    assert [(r[0], r[1], r[3], r[4], r[-1]) for r in rows] == [
        ("0", "0", "1001", "0", "clean"), ("1", "1", "1002", "0", "leak"), ("1", "1", "1002", "1", "leak")]
    assert rows[0][2].startswith("a-rather-lon")


def test_no_rank_table_without_ranks():
    out = io.StringIO()
    report = json.loads((FIXTURES / "clean_adam.json").read_text())
    rec, d = parse(report)
    terminal.render(Console(file=out, width=80, no_color=True), rec, d)
    assert "Ranks" not in out.getvalue()


def test_the_html_page_has_the_rank_table_and_one_page_draws_two_nodes():
    pytest.importorskip("plotly")
    from gpumemdoctor.reporters import html

    rec = job([Rank(0), Rank(1, stray=500 * MIB)])
    page = html.render(rec, diagnose(rec), "r.json")
    ranks_html = page.split('<section id="ranks">', 1)[1].split("</section>", 1)[0]
    assert "2 ranks on 1 host (node-a)" in ranks_html
    assert ranks_html.count("<tr>") == 1 + 3  # the head, rank 0, rank 1 on two GPUs
    assert 'class="verdict v-stray-context">stray-context<' in ranks_html
    a, b = two_nodes()
    page = html.render_job([a, b], diagnose_job([a, b]), ["a.json", "b.json"])
    assert 'id="timeline-0-1001-0"' in page and 'id="timeline-1-1001-0"' in page
    assert "node-b: process 1002, GPU 1" in page and "4 ranks on 2 hosts" in page
    assert "Warning: Rank 3&#x27;s peak" in page


# -- checks and compare per rank ----------------------------------------------------------------

def test_ceilings_apply_per_rank_and_name_the_rank_over():
    rec = job([Rank(0), Rank(1, leak_per_step=16 * MIB)])
    d = diagnose(rec)
    limit = 3 * GIB
    results = checks.evaluate(rec, d, checks.Policy(max_peak_bytes=limit, max_retained_bytes=limit))
    by = {r.name: r for r in results}
    assert [r.name for r in results] == ["max-peak", "max-peak rank 0", "max-peak rank 1",
                                         "max-retained", "max-retained rank 0", "max-retained rank 1"]
    assert by["max-peak rank 0"].passed and not by["max-peak rank 1"].passed
    assert not by["max-peak"].passed and "the highest, rank 1" in by["max-peak"].message
    assert by["max-peak"].measured == d.ranks[1].peak_nvml_bytes
    assert by["max-retained"].passed and "rank 1" in by["max-retained"].message
    loose = checks.evaluate(rec, d, checks.Policy(max_peak_bytes=8 * GIB))
    assert all(r.passed for r in loose)


def test_a_stray_context_is_not_retained_memory_of_its_rank():
    rec = job([Rank(0), Rank(1, stray=500 * MIB)])
    figs = checks.rank_figures(rec, diagnose(rec))
    assert figs[1]["retained_bytes"] == figs[0]["retained_bytes"] == 2 * GIB + 256 * MIB
    assert figs[1]["peak_nvml_bytes"] == 2 * GIB + 256 * MIB + CONTEXT  # its GPU's, not the sum


def test_baselines_compare_rank_by_rank(tmp_path):
    old_rec = job([Rank(0), Rank(1)])
    doc = checks.baseline_document(old_rec, diagnose(old_rec))
    assert set(doc["ranks"]) == {"0", "1"}
    path = tmp_path / "base.json"
    baseline_file.write_baseline(str(path), doc)
    loaded = baseline_file.load_baseline(str(path))
    assert loaded["ranks"][1]["peak_allocated_bytes"] == 2 * GIB
    from gpumemdoctor.app.checks import make_policy
    policy = make_policy(None, None, None, "5%", None, loaded)
    assert "ranks" not in policy.baseline and set(policy.baseline_ranks) == {0, 1}
    new_rec = job([Rank(0), Rank(1, leak_per_step=16 * MIB), Rank(2)], gpus=4)
    by = {r.name: r for r in checks.evaluate(new_rec, diagnose(new_rec), policy)}
    assert by["baseline rank 0 peak_allocated_bytes"].passed
    assert not by["baseline rank 1 peak_allocated_bytes"].passed
    assert "of rank 1" in by["baseline rank 1 peak_allocated_bytes"].message
    assert by["baseline ranks"].passed and "rank 2 only in this run" in by["baseline ranks"].message
    # the job's live tensors are the ranks' together (the launcher, the target, holds none)
    assert checks.figures(new_rec, diagnose(new_rec))["live_tensor_bytes"] == 6 * GIB + 640 * MIB


@pytest.mark.parametrize("ranks_value", [{"x": {}}, {"0": []}, {"0": {"peak_allocated_bytes": "1"}}, []])
def test_a_baselines_ranks_are_read_strictly(tmp_path, ranks_value):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"schema": checks.BASELINE_SCHEMA, "tool_version": "0", "figures": {},
                                "ranks": ranks_value}))
    with pytest.raises(BadReportError):
        baseline_file.load_baseline(str(path))


def write_reports(folder: Path, **recordings: Recording) -> None:
    for name, rec in recordings.items():
        (folder / f"{name}.json").write_text(json.dumps(build(rec, diagnose(rec))))


def test_compare_shows_each_rank(cli, tmp_path):
    write_reports(tmp_path, old=job([Rank(0), Rank(1)]), new=job([Rank(0), Rank(1, leak_per_step=16 * MIB)]))
    result = cli("compare", "old.json", "new.json", "--max-peak", "3GiB", cwd=tmp_path)
    assert result.returncode == 10, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split() == ["rank", "1", "verdict", "clean", "leak"] for line in lines)
    assert any(line.startswith("rank 0 peak_reserved_bytes") for line in lines)
    assert any("FAIL max-peak rank 1" in line for line in lines)
    assert any("FAIL baseline rank 1 peak_allocated_bytes" in line for line in lines)


# -- report A.json B.json -----------------------------------------------------------------------

def test_report_of_two_nodes(cli, tmp_path):
    a, b = two_nodes()
    write_reports(tmp_path, a=a, b=b)
    result = cli("report", "a.json", "b.json", "--width", "80", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("gpumemdoctor verdict: leak")
    assert "Host     node-a" in out and "Host     node-b" in out
    assert "Ranks    4 ranks on 2 hosts (node-a, node-b); leak on rank 1 only, of 4 ranks" in out
    assert "rank-imbalance  3.00 GiB  on node-b" in out
    assert out.rstrip().endswith("Reports: a.json, b.json")


def test_report_of_two_nodes_as_html(cli, tmp_path):
    pytest.importorskip("plotly")
    write_reports(tmp_path, **dict(zip("ab", two_nodes())))
    result = cli("report", "a.json", "b.json", "--html", "job.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("HTML report: job.html")
    assert '<section id="ranks">' in (tmp_path / "job.html").read_text()


def test_report_refuses_the_same_run_twice_and_what_is_not_a_report(cli, tmp_path):
    a, _ = two_nodes()
    write_reports(tmp_path, a=a)
    (tmp_path / "copy.json").write_text((tmp_path / "a.json").read_text())
    (tmp_path / "other.json").write_text("{}")
    for args, code, words in ((("a.json", "a.json"), 2, "a.json is given twice"),
                              (("a.json", "copy.json"), 2, "a.json and copy.json are the same run"),
                              (("a.json", "other.json"), 4, "other.json is not a valid report"),
                              (("a.json", "missing.json"), 2, "missing.json does not exist"),
                              (("a.json", "--from-run-dir", "."), 2, "not both")):
        result = cli("report", *args, cwd=tmp_path)
        assert result.returncode == code, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("b, reason", [
    (lambda: job([Rank(2, local_rank=0), Rank(3, local_rank=1)], host="node-b", world_size=8, node_rank=1),
     "a.json has world size 4, b.json 8"),
    (lambda: job([Rank(2, local_rank=0), Rank(3, local_rank=1)], host="node-b", world_size=4, node_rank=1,
                 run_id="job-2"), "a.json has run id 'job-1', b.json 'job-2'"),
    (lambda: job([Rank(0), Rank(1)], host="node-b", world_size=4), "rank 0 is in both a.json and b.json"),
    (lambda: job([Rank(2, local_rank=0), Rank(3, local_rank=1)], host="node-b", world_size=4, node_rank=1,
                 started_wall=1_700_086_400.0), "a.json ended at 2023-11-14 22:13:25 UTC, before b.json started "
                                                "at 2023-11-15 22:13:20 UTC"),
], ids=["world size", "run id", "a rank twice", "a day apart"])
def test_report_refuses_reports_that_are_not_one_jobs_nodes(cli, tmp_path, b, reason):
    """Issue 41, cause 12: two unrelated runs were merged into one job, with one job's verdict."""
    a, _ = two_nodes()
    write_reports(tmp_path, a=a, b=b())
    result = cli("report", "a.json", "b.json", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"gpumemdoctor: error: a.json, b.json are not the nodes of one distributed "
                                          f"job ({reason}): give one report at a time, or the reports of one job's "
                                          "nodes"]


def test_report_refuses_two_runs_without_ranks(cli, tmp_path):
    leak, peak = (str(FIXTURES / f"{name}.json") for name in ("leak_training_list", "peak_adamw"))
    result = cli("report", leak, peak, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"({leak} has no ranks: its run was not a distributed job)" in result.stderr
    assert result.stdout == ""


# -- the default report name --------------------------------------------------------------------

def named(env: dict, rec: Recording | None = None) -> str:
    return default_name("train", rec or job([Rank(0)], host="gpu-07.cluster.example"), env)


def test_on_one_machine_the_name_is_unchanged():
    plain = job([Rank(0), Rank(1)], host="box")  # torchrun on one machine: world size = local world size
    assert default_name("train", plain, {}) == "gpumemdoctor-train.1000.json"
    assert default_name("train", Recording(tool_version="0", target={"pid": 5}, started_wall=0, duration_s=0,
                                           poll_interval_s=0.005, nvml_available=False), {}) == "gpumemdoctor-train.5.json"


def test_under_a_launcher_the_name_has_the_host_node_and_task():
    assert named({"SLURM_NODEID": "1", "SLURM_PROCID": "1"}) == "gpumemdoctor-train.gpu-07.node1.rank1.1000.json"
    assert named({"GROUP_RANK": "2"}) == "gpumemdoctor-train.gpu-07.node2.1000.json"
    assert named({"RANK": "3"}) == "gpumemdoctor-train.gpu-07.node0.rank3.1000.json"  # node from the ranks' own
    spans = job([Rank(0), Rank(1)], host="n/1", world_size=4, node_rank=1)  # 2 of 4 ranks: several nodes
    assert default_name("train", spans, {}) == "gpumemdoctor-train.n_1.node1.1000.json"


def test_rank_words():
    assert ranks.who(5, Dist(rank=1, local_rank=0)) == "process 5 (rank 1, local rank 0)"
    assert ranks.who(5, None) == "process 5"
    assert ranks.ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert isinstance(AgentRecording(pid=1).dist, type(None))


# -- the combine step ---------------------------------------------------------------------------

def test_the_combine_step_reads_the_rank_and_keeps_a_process_whose_rank_is_malformed(tmp_path):
    from gpumemdoctor.recording.agent_files import OTHER_SERIES, TARGET_SERIES, AgentFiles

    lines = {
        11: {"type": "hello", "pid": 11, "ppid": 1, "t": 0.0, "argv": ["train.py"],
             "dist": {"rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2, "node_rank": 0,
                      "run_id": "r", "source": "torch"}},
        12: {"type": "hello", "pid": 12, "ppid": 1, "t": 0.0, "argv": ["train.py"], "dist": {"rank": "1"}},
        13: {"type": "hello", "pid": 13, "ppid": 1, "t": 0.0, "argv": ["train.py"], "dist": None},
    }
    for pid, hello in lines.items():
        (tmp_path / f"agent-{pid}.jsonl").write_text(json.dumps(hello) + "\n")
    files = AgentFiles(str(tmp_path), 0.0, target_pid=1, remove_read=False)
    files.poll()
    sizes = {int(name[6:-6]): reader._sizes for name, reader in files._files.items()}
    assert sizes == {11: TARGET_SERIES, 12: OTHER_SERIES, 13: OTHER_SERIES}  # a rank keeps a target's samples
    agents = {a.pid: a for a in files.finish()[0]}
    assert agents[11].dist == Dist(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0,
                                   run_id="r", source="torch")
    assert agents[12].dist is None and agents[12].errors and "dist rank" in agents[12].errors[0]
    assert agents[13].dist is None and not agents[13].errors


def test_a_recovered_run_keeps_its_host(tmp_path):
    from gpumemdoctor.supervise.recovery import RUN_FILE, RUN_SCHEMA, recover

    info = {"schema": RUN_SCHEMA, "t0": 0.0, "started_wall": 1.0e9, "target_args": ["train.py"], "pid": 2 ** 22,
            "create_time": None, "poll_interval_s": 0.005, "measure_gpu": False, "host": "node-c"}
    (tmp_path / RUN_FILE).write_text(json.dumps(info))
    assert recover(str(tmp_path)).host == "node-c"
    (tmp_path / RUN_FILE).write_text(json.dumps({**info, "host": None}))  # a run folder of an older version
    assert recover(str(tmp_path)).host is None


# -- real two-rank jobs (tests/fixtures/ranks, recorded on an H100: both ranks on one GPU) ---------

RECORDED = FIXTURES.parent / "ranks"


def recorded(name: str):
    recording, _ = parse(json.loads((RECORDED / f"{name}.json").read_text()))
    return recording, diagnose(recording)


def test_recorded_clean_job_is_clean_on_both_ranks():
    recording, d = recorded("ddp_clean")
    assert d.verdict == "clean"
    assert sorted((r.rank, r.verdict) for r in d.ranks) == [(0, "clean"), (1, "clean")]
    assert not of_kind(d, "rank-imbalance") and not of_kind(d, "stray-context")
    launcher = recording.agent(recording.target_pid)
    assert launcher.dist is None and recording.target_pid not in {r.pid for r in d.ranks}


def test_recorded_leak_on_rank_1_is_named_on_rank_1_only():
    recording, d = recorded("ddp_leak_one_rank")
    rank_of = {r.pid: r.rank for r in d.ranks}
    assert d.verdict == "leak"
    assert {rank_of[f.pid] for f in of_kind(d, "leak")} == {1}
    assert {r.rank: r.verdict for r in d.ranks} == {0: "clean", 1: "leak"}
    assert d.job.ranks_with_leak == [1]
    leak = of_kind(d, "leak")[0]
    assert "rank 1" in leak.summary and 1000 * MIB <= leak.bytes <= 1300 * MIB  # 4 MiB a step kept


def test_recorded_imbalance_names_rank_0_and_leaves_the_verdict_clean():
    recording, d = recorded("ddp_imbalance")
    assert d.verdict == "clean"
    (finding,) = of_kind(d, "rank-imbalance")
    assert finding.evidence["rank"] == 0
    assert 2.9 * GIB <= finding.bytes <= 3.1 * GIB  # the 3 GiB buffer only rank 0 holds
