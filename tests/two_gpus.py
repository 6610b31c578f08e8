"""What the two-GPU runs of issue 29 must show, as checks on their reports: the same checks for a run
made now on two GPUs (tests/gpu/test_ranks.py) and for its recording, judged again by this version
on the CPU (tests/test_ranks_two_gpus.py, over tests/fixtures/ranks_two_gpus)."""
from __future__ import annotations

MIB = 1 << 20
ALLOWANCE = 512 * MIB  # diagnosis.non_torch.LIBRARY_ALLOWANCE_BYTES


def rank_agents(report: dict) -> dict:
    """rank -> its agent, for the processes that ran as ranks."""
    out = {}
    for agent in report["recording"]["agents"]:
        dist = agent.get("dist")
        if dist and dist.get("rank") is not None:
            out[dist["rank"]] = agent
    return out


def events_in_every_rank(report: dict, ranks: int = 2) -> None:
    """Every rank kept its allocation events (issue 40), and no reading of them failed."""
    agents = rank_agents(report)
    assert sorted(agents) == list(range(ranks)), sorted(agents)
    for rank, agent in agents.items():
        root = agent["root"]
        assert [h["ok"] for h in root["histories"]] == [True], (rank, root["histories"])
        failed = [r for r in root.get("peak_histories", []) + root.get("forward_modules", []) if "error" in r]
        assert not failed, (rank, failed)


def rows_by_rank(report: dict) -> dict:
    out: dict = {}
    for row in report["ranks"]:
        out.setdefault(row["rank"], []).append(row)
    return out


def summaries(report: dict) -> list[str]:
    return [f"{f['kind']}: {f['summary']}" for f in report["findings"]]


def nccl_clean(report: dict, variables: dict | None = None) -> None:
    """A clean DDP job on NCCL, a GPU per rank: clean, NCCL's memory named on each rank's GPU, with
    the `variables` that size it among those recorded."""
    assert report["verdict"] == "clean", summaries(report)
    agents = rank_agents(report)
    assert sorted(agents) == [0, 1]
    for rank, agent in agents.items():
        groups = agent["root"].get("groups") or []
        assert groups and "nccl" in groups[0]["backends"][0], groups
        assert groups[0]["nccl_env"].get("NCCL_NVLS_ENABLE") == "0"
        assert groups[0]["nccl_env"].items() >= (variables or {}).items(), groups[0]["nccl_env"]
        (b,) = [b for b in report["breakdown"] if b["pid"] == agent["pid"]]
        assert b["device"] == rank and b["nccl"] is True
        assert (b.get("non_torch_nccl_bytes") or 0) > 0, b
        assert b["non_torch_bytes"] - b["non_torch_nccl_bytes"] <= ALLOWANCE, b
    assert {r["verdict"] for r in report["ranks"]} == {"clean"}
    assert not [f for f in report["findings"] if f["kind"] in ("non-torch", "stray-context")]


def new_group_growth(report: dict) -> None:
    """A new process group every step: NCCL's memory grows on each rank, a non-torch finding naming
    the groups."""
    assert report["verdict"] == "non-torch", summaries(report)
    growing = [f for f in report["findings"] if f["kind"] == "non-torch"]
    assert {f["evidence"]["rank"] for f in growing} == {0, 1}, growing
    for f in growing:
        assert "kept growing past warm-up" in f["summary"] and "process groups went from" in f["summary"], f
        assert f["evidence"]["nccl_detail"]["groups_most"] >= 30
        assert f["remedy"].startswith("Make process groups once")


def clean_job(report: dict, ranks: int = 2) -> None:
    assert report["verdict"] == "clean", summaries(report)
    assert sorted(rows_by_rank(report)) == list(range(ranks))
    assert {r["verdict"] for r in report["ranks"]} == {"clean"}


def no_pending(report: dict, ranks: int = 2) -> None:
    """Clean, and nothing called pending-stream: FSDP's and a prefetcher's record_stream blocks whose
    work had finished are cache (issue 42)."""
    clean_job(report, ranks)
    assert all((b.get("pending_stream_bytes") or 0) < 64 * MIB for b in report["breakdown"]), report["breakdown"]


def context_before_nccl(report: dict) -> None:
    """init_process_group(device_id=...): NCCL set up before the first allocation. The context was
    read inside that call, before NCCL (a `contexts` record on every rank), so NCCL's memory is a
    figure of its own and the context is a context's size (issue 42)."""
    nccl_clean(report)
    for rank, agent in rank_agents(report).items():
        assert agent["root"].get("contexts"), f"rank {rank}: no context read before NCCL"
        (b,) = [b for b in report["breakdown"] if b["pid"] == agent["pid"]]
        assert not b.get("context_after_nccl"), b
        assert b["context_bytes"] <= 800 * MIB and b["non_torch_nccl_bytes"] >= 100 * MIB, b


def leak_on_rank_1(report: dict, kept_bytes: int, ranks: int = 2) -> None:
    """Rank 1 alone keeps each step's output: a leak on rank 1 of about `kept_bytes`, the other ranks
    clean."""
    assert report["verdict"] == "leak", summaries(report)
    agents = rank_agents(report)
    assert sorted(agents) == list(range(ranks))
    leaks = [f for f in report["findings"] if f["kind"] == "leak"]
    assert {f["pid"] for f in leaks} == {agents[1]["pid"]}
    rows = rows_by_rank(report)
    assert {r["verdict"] for r in rows[1]} == {"leak"}
    assert {r["verdict"] for rank, got in rows.items() if rank != 1 for r in got} == {"clean"}
    assert abs(leaks[0]["bytes"] - kept_bytes) <= 200 * MIB, leaks[0]["bytes"]
    assert report["job"]["ranks_with_leak"] == [1]


def stray_on_gpu_0(report: dict, reserved_there: bool) -> None:
    """Rank 1's context on GPU 0, rank 0's GPU: one stray-context, with its rank, PID, GPU and bytes;
    `reserved_there`: PyTorch reserved a little there (a tensor made before set_device)."""
    stray = [f for f in report["findings"] if f["kind"] == "stray-context"]
    assert [(f["evidence"]["rank"], f["device"]) for f in stray] == [(1, 0)], summaries(report)
    assert stray[0]["pid"] == rank_agents(report)[1]["pid"]
    assert stray[0]["bytes"] >= 100 * MIB  # a context is about 500 MiB
    assert (stray[0]["evidence"]["reserved_there_bytes"] > 0) is reserved_there
    assert report["verdict"] == "stray-context", summaries(report)


def watch_flags(line: dict) -> None:
    """A `watch --jsonl` line of the launcher of the stray job: rank 1's context on GPU 0 flagged."""
    ranks = {r["rank"]: r["pid"] for r in line["processes"] if r["role"] == "rank"}
    flags = [f for f in line["flags"] if f["flag"] == "stray-context"]
    assert [(f["rank"], f["pid"], f["gpu"]) for f in flags] == [(1, ranks[1], 0)], line
    assert flags[0]["bytes"] > 0


def ps_flags(listed: dict, launcher: int | None = None) -> None:
    """`ps --json` while the stray job runs: the job grouped by its launcher, rank 1 flagged."""
    jobs = [j for j in listed["jobs"] if j["launcher"] and j["launcher_kind"] == "torchrun"
            and (launcher is None or j["launcher"]["pid"] == launcher)]
    assert len(jobs) == 1, listed["jobs"]
    ranks = {r["rank"]: r for r in jobs[0]["ranks"]}
    assert sorted(ranks) == [0, 1] and ranks[0]["flags"] == []
    (flag,) = ranks[1]["flags"]
    assert (flag["flag"], flag["gpu"], flag["pid"]) == ("stray-context", 0, ranks[1]["pid"]) and flag["bytes"] > 0


def two_nodes(diagnosis) -> None:
    """Two nodes' reports (a GPU each) diagnosed as one job."""
    assert sorted(r.rank for r in diagnosis.ranks) == [0, 1]
    assert diagnosis.job.missing_ranks == [] and diagnosis.job.world_size == 2
    assert diagnosis.verdict == "clean", [f.summary for f in diagnosis.findings]
    assert {r.device for r in diagnosis.ranks} == {0, 1}  # NVML's GPU of each node, though each saw cuda:0


# The two-GPU jobs of scenarios/ranks and what each must show: run by tests/gpu/test_ranks.py,
# judged again from their recordings by tests/test_ranks_two_gpus.py (with RECORDED's too).
JOBS = {
    "ddp_nccl_clean": lambda r: nccl_clean(r, variables={"NCCL_BUFFSIZE": str(2 << 20)}),
    "nccl_new_group_every_step": new_group_growth,
    "fsdp_clean": no_pending,
    "fsdp1_strategies_clean": no_pending,
    "fsdp_prefetch_clean": no_pending,
    "ddp_bucket_view_clean": no_pending,
    "ddp_nccl_device_id": context_before_nccl,
    "fsdp_leak_one_rank": lambda r: leak_on_rank_1(r, 800 * MIB),  # 200 steps of 4 MiB
    "ddp_tensor_before_set_device": lambda r: stray_on_gpu_0(r, reserved_there=True),
}
# The FSDP jobs on four ranks, a GPU each (tests/gpu/test_ranks.py, where four GPUs are lent; recorded
# as NAME_4ranks.json).
FOUR_RANKS = {
    "fsdp_clean": lambda r: no_pending(r, ranks=4),
    "fsdp_leak_one_rank": lambda r: leak_on_rank_1(r, 800 * MIB, ranks=4),
}
# Jobs that also run on one GPU, whose two-GPU recordings are judged the same way.
RECORDED = {**JOBS, "ddp_clean": nccl_clean, "ddp_leak_one_rank": lambda r: leak_on_rank_1(r, 1200 * MIB),
            "ddp_stray_context": lambda r: stray_on_gpu_0(r, reserved_there=False),
            **{f"{name}_4ranks": check for name, check in FOUR_RANKS.items()}}
