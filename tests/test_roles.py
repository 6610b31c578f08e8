"""Who is who in a job (gpumemdoctor/live/roles.py), on plain facts: launchers, ranks, workers, groups."""
from __future__ import annotations

from gpumemdoctor.live.roles import Identity, ProcessFacts, group, launcher_kind, place

MIB = 1 << 20
GIB = 1 << 30
PY = "/venv/bin/python3"


def rank_env(rank: int, run_id: str = "run-a", **more) -> dict:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": run_id,
            **more}


def facts(*rows) -> dict[int, ProcessFacts]:
    """rows: (pid, ppid, cmdline, environment or None when it is not ours to read)."""
    return {pid: ProcessFacts(pid, ppid, cmdline, Identity.from_environ(env) if env is not None else None)
            for pid, ppid, cmdline, env in rows}


def parents_of(f: dict[int, ProcessFacts], **extra) -> dict[int, int]:
    return {pid: x.ppid for pid, x in f.items()} | {int(k[1:]): v for k, v in extra.items()}


def test_launcher_kind():
    assert launcher_kind([PY, "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"]) == "torchrun"
    assert launcher_kind(["/usr/local/bin/torchrun", "train.py"]) == "torchrun"
    assert launcher_kind([PY, "-u", "-m", "torch.distributed.run", "train.py"]) == "torchrun"
    assert launcher_kind(["python", "-mtorch.distributed.launch", "train.py"]) == "torch.distributed.launch"
    assert launcher_kind(["python", "-W", "ignore", "-m", "torch.distributed.run"]) == "torchrun"
    # gpumemdoctor's supervisor running torchrun is not the launcher; its child is
    assert launcher_kind([PY, "-m", "gpumemdoctor", "run", "torchrun", "train.py"]) is None
    for other in ([PY, "train.py"], [PY, "-c", "import torchrun"], ["bash", "torchrun"], [], None,
                  [PY, "-m"], [PY, "-m", "torch.distributed.elastic"]):
        assert launcher_kind(other) is None, other


def test_identity_from_the_environment():
    i = Identity.from_environ(rank_env(1, TORCHELASTIC_RESTART_COUNT="2"))
    assert (i.rank, i.local_rank, i.world_size, i.run_id, i.restart_count, i.rank_variable) == (
        1, 1, 2, "run-a", 2, "RANK")
    slurm = Identity.from_environ({"SLURM_JOB_ID": "77", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                                   "SLURM_NTASKS": "8"})
    assert (slurm.rank, slurm.local_rank, slurm.world_size, slurm.slurm_job_id, slurm.rank_variable) == (
        3, 1, 8, "77", "SLURM_PROCID")
    assert Identity.from_environ({"RANK": "x", "TORCHELASTIC_RUN_ID": "none"}) == Identity()
    assert not Identity().in_job and Identity(slurm_job_id="7").in_job


def test_place_under_a_launcher_and_by_environment():
    f = facts((1, 0, ["/sbin/init"], None),
              (10, 1, ["bash"], {}),
              (100, 10, [PY, "/venv/bin/torchrun", "train.py"], {}),
              (101, 100, [PY, "-u", "train.py"], rank_env(0)),
              (102, 100, [PY, "-u", "train.py"], None),  # another user's rank: number unknown
              (103, 101, [PY, "-c", "worker"], rank_env(0)),  # a DataLoader worker inherits RANK
              (200, 10, ["slurmstepd"], {}),  # ranks started without a known launcher
              (201, 200, [PY, "b.py"], rank_env(0, "run-b")),
              (202, 201, [PY, "-c", "worker"], rank_env(0, "run-b")),
              (300, 1, [PY, "c.py"], rank_env(5, "run-c")),  # its launcher has gone
              (400, 10, [PY, "plain.py"], {}),
              (500, 10, [PY, "other.py"], None))
    assert (place(101, f).anchor, place(101, f).rank_pid, place(101, f).role) == (100, 101, "rank")
    assert (place(102, f).rank_pid, place(102, f).identity) == (102, None)
    assert (place(103, f).rank_pid, place(103, f).role, place(103, f).identity.rank) == (101, "worker", 0)
    assert place(100, f).role == "launcher"
    assert (place(201, f).anchor, place(201, f).rank_pid) == (200, 201)
    assert (place(202, f).anchor, place(202, f).rank_pid, place(202, f).role) == (200, 201, "worker")
    assert (place(300, f).anchor, place(300, f).rank_pid) == (None, 300)
    assert place(400, f) is None and place(500, f) is None and place(999, f) is None


def test_a_torchrun_job_with_a_stray_context():
    f = facts((1, 0, ["/sbin/init"], None),
              (100, 1, [PY, "-m", "torch.distributed.run", "--nproc-per-node", "3", "train.py"], {}),
              (101, 100, [PY, "-u", "train.py"], rank_env(0)),
              (102, 100, [PY, "-u", "train.py"], rank_env(1)),
              (103, 100, [PY, "-u", "train.py"], rank_env(2)),  # holds nothing yet
              (104, 101, [PY, "-c", "worker"], rank_env(0)),
              (900, 1, [PY, "alone.py"], {}))
    parents = parents_of(f, p105=101, p106=105)  # two more descendants of rank 0, holding nothing
    held = {101: {0: 20 * GIB}, 102: {0: 512 * MIB, 1: 20 * GIB}, 104: {0: 500 * MIB}, 900: {1: GIB}}
    (job,) = group(held, f, parents)
    assert job.launcher.pid == 100 and job.launcher_kind == "torchrun" and job.run_id == "run-a"
    assert job.world_size == 2 and job.launcher.gpus == []
    assert [(r.rank, r.local_rank, r.pid) for r in job.ranks] == [(0, 0, 101), (1, 1, 102), (2, 2, 103)]
    r0, r1, r2 = job.ranks
    assert r0.gpus == [{"index": 0, "used_bytes": 20 * GIB}]
    assert [(w.pid, w.gpus) for w in r0.workers] == [(104, [{"index": 0, "used_bytes": 500 * MIB}])]
    assert r0.quiet_descendants == [105, 106] and r2.gpus == [] and r2.quiet_descendants == []
    assert job.gpus == [{"index": 0, "used_bytes": 20 * GIB + 512 * MIB + 500 * MIB},
                        {"index": 1, "used_bytes": 20 * GIB}]
    # rank 1 holds 512 MiB on GPU 0, rank 0's GPU, and works on GPU 1 (where it holds the most)
    assert r0.flags == [] and [x["flag"] for x in r1.flags] == ["stray-context"]
    (flag,) = r1.flags
    assert (flag["pid"], flag["rank"], flag["gpu"], flag["bytes"]) == (102, 1, 0, 512 * MIB)
    text = flag["next_step"]
    assert "rank 1 (PID 102) holds 512 MiB on GPU 0, the GPU of rank 0 (PID 101), while it works on GPU 1" in text
    assert "torch.cuda.set_device(local_rank)" in text and "LOCAL_RANK is 1 here" in text


def test_a_rank_on_two_gpus_of_its_own_is_only_told_to_look():
    """No other rank works on GPU 1 and no agent says what PyTorch reserved: which context is stray is
    not known from outside."""
    f = facts((1, 0, ["/sbin/init"], None),
              (100, 1, [PY, "-m", "torch.distributed.run", "--nproc-per-node", "1", "train.py"], {}),
              (101, 100, [PY, "train.py"], rank_env(0)))
    held = {101: {0: 20 * GIB, 1: 512 * MIB}}
    (job,) = group(held, f, parents_of(f))
    assert [x["flag"] for x in job.ranks[0].flags] == ["context-on-several-gpus"]
    text = job.ranks[0].flags[0]["next_step"]
    assert "GPU 0 (20.0 GiB) as well as on GPU 1 (512 MiB)" in text and "unknown from outside" in text
    # its agent says PyTorch reserved nothing on GPU 1: that context is stray, for certain
    (job,) = group(held, f, parents_of(f), reserved={101: {0: 18 * GIB, 1: 0}})
    (flag,) = job.ranks[0].flags
    assert (flag["flag"], flag["gpu"], flag["bytes"]) == ("stray-context", 1, 512 * MIB)
    assert "its PyTorch reserved nothing there" in flag["next_step"]
    # and where it reserved a lot on both, neither is called stray
    (job,) = group(held, f, parents_of(f), reserved={101: {0: 18 * GIB, 1: 400 * MIB}})
    assert [x["flag"] for x in job.ranks[0].flags] == ["context-on-several-gpus"]


def test_jobs_are_told_apart_and_joined_by_their_ids():
    f = facts((1, 0, ["/sbin/init"], None),
              (100, 1, [PY, "/venv/bin/torchrun", "a.py"], {}),
              (101, 100, [PY, "a.py"], rank_env(0, "run-a")),
              (200, 1, [PY, "/venv/bin/torchrun", "b.py"], {}),
              (201, 200, [PY, "b.py"], rank_env(0, "run-b")),
              (202, 200, [PY, "b.py"], None),  # not ours: rank unknown, still rank of job b
              # ranks whose launcher has gone, joined by their run id
              (301, 1, [PY, "c.py"], rank_env(0, "run-c")),
              (302, 1, [PY, "c.py"], rank_env(1, "run-c")),
              # a Slurm job's processes, no launcher, no run id
              (401, 1, [PY, "d.py"], {"SLURM_JOB_ID": "55", "SLURM_PROCID": "0"}),
              (402, 1, [PY, "d.py"], {"SLURM_JOB_ID": "55", "SLURM_PROCID": "1"}),
              (501, 1, [PY, "e.py"], {}))
    held = {pid: {0: GIB} for pid in (101, 201, 202, 301, 302, 401, 402, 501)}
    jobs = group(held, f, parents_of(f))
    by_ranks = {tuple(r.pid for r in j.ranks): j for j in jobs}
    assert set(by_ranks) == {(101,), (201, 202), (301, 302), (401, 402)}
    assert by_ranks[(201, 202)].ranks[1].rank is None and by_ranks[(201, 202)].launcher.pid == 200
    assert by_ranks[(301, 302)].launcher is None and by_ranks[(301, 302)].run_id == "run-c"
    assert by_ranks[(401, 402)].slurm_job_id == "55" and [r.rank for r in by_ranks[(401, 402)].ranks] == [0, 1]
    assert by_ranks[(101,)].gpus == [{"index": 0, "used_bytes": GIB}]


def test_unavailable_figures_make_an_unavailable_total():
    f = facts((1, 0, ["/sbin/init"], None), (100, 1, [PY, "/venv/bin/torchrun"], {}),
              (101, 100, [PY, "a.py"], rank_env(0)), (102, 100, [PY, "a.py"], rank_env(1)))
    (job,) = group({101: {0: None}, 102: {0: GIB}, 100: {1: GIB}}, f, parents_of(f))
    assert job.gpus == [{"index": 0, "used_bytes": None}, {"index": 1, "used_bytes": GIB}]
    assert job.launcher.gpus == [{"index": 1, "used_bytes": GIB}]
    assert group({}, f, parents_of(f)) == []
