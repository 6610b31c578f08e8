"""Multi-rank jobs, run for real: `gpumemdoctor run -m torch.distributed.run --nproc-per-node 2`
over the scenarios in scenarios/ranks. On one GPU the two ranks share it (gloo); the jobs on NCCL
(a clean one, a new group every step, FSDP), the stray contexts, `watch` and `ps` on a job, two
nodes' reports and CUDA_VISIBLE_DEVICES need two GPUs and skip otherwise. Every program started
here has NVLink multicast off (NO_MULTICAST).

Set GPUMEMDOCTOR_FIXTURE_DIR to keep each report: in its `ranks/` folder on one GPU (that is how
tests/fixtures/ranks was made), in `ranks_two_gpus/` on two or more (tests/fixtures/ranks_two_gpus,
judged by tests/test_ranks_two_gpus.py). tests/gpu/record_ranks.sh runs them all and keeps them.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import two_gpus
from tests.expect import expectations
from tests.two_gpus import rank_agents

ROOT = Path(__file__).resolve().parents[2]
RANKS = ROOT / "scenarios" / "ranks"
SKIP_EXIT = 77
MIB = 1 << 20
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetCount()


def need_gpus(count: int) -> None:
    if gpu_count() < count:
        pytest.skip(f"needs {count} GPUs")


def keep(path: Path, name: str, stderr: str | None = None) -> None:
    """Keep a report (or another record of a run) as a fixture, where GPUMEMDOCTOR_FIXTURE_DIR says."""
    base = os.environ.get("GPUMEMDOCTOR_FIXTURE_DIR")
    if not base:
        return
    folder = Path(base) / ("ranks_two_gpus" if gpu_count() >= 2 else "ranks")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, folder / name)
    if stderr is not None:
        (folder / f"{Path(name).stem}.stderr.txt").write_text(stderr)


def environment(**extra: str) -> dict:
    return {**os.environ, **NO_MULTICAST, **extra}


def run_job(name: str, tmp_path: Path, keep_as: str | None = None, ranks: int = 2) -> dict:
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report), "-m", "torch.distributed.run",
           "--standalone", "--nproc-per-node", str(ranks), str(RANKS / f"{name}.py")]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment())
    if proc.returncode == SKIP_EXIT or "skip: this scenario needs" in proc.stderr:
        pytest.skip("the scenario needs more GPUs than this machine has")
    assert report.exists(), proc.stderr
    data = json.loads(report.read_text())
    keep(report, f"{keep_as or name}.json", proc.stderr)
    data["_stderr"] = proc.stderr
    data["_returncode"] = proc.returncode
    return data


def test_a_clean_two_rank_job_is_clean_with_a_row_per_rank(tmp_path):
    report = run_job("ddp_clean", tmp_path)
    assert report["_returncode"] == 0, report["_stderr"]
    assert report["verdict"] == "clean", (report["findings"], report["_stderr"])
    agents = rank_agents(report)
    assert sorted(agents) == [0, 1]
    for rank, agent in agents.items():
        assert agent["dist"]["world_size"] == 2 and agent["dist"]["local_rank"] == rank
        assert agent["samples"], f"rank {rank} was not sampled"
    rows = report["ranks"]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert {r["verdict"] for r in rows} == {"clean"}
    assert all(r["peak_reserved_bytes"] > 100 * MIB for r in rows)
    assert not [f for f in report["findings"] if f["kind"] in ("stray-context", "rank-imbalance")]
    if gpu_count() >= 2:  # a GPU per rank: NCCL, whose memory is named, not called non-torch
        two_gpus.nccl_clean(report)


def test_a_leak_on_one_rank_is_named_on_that_rank_only(tmp_path):
    report = run_job("ddp_leak_one_rank", tmp_path)
    assert report["verdict"] == "leak", (report["findings"], report["_stderr"])
    agents = rank_agents(report)
    leaks = [f for f in report["findings"] if f["kind"] == "leak"]
    assert {f["pid"] for f in leaks} == {agents[1]["pid"]}
    rows = {r["rank"]: r for r in report["ranks"]}
    assert rows[1]["verdict"] == "leak" and rows[0]["verdict"] == "clean"
    assert "rank 1" in leaks[0]["summary"]
    assert abs(leaks[0]["bytes"] - 1200 * MIB) <= 200 * MIB  # 300 steps of 4 MiB


def test_an_imbalanced_job_names_the_heavy_rank(tmp_path):
    report = run_job("ddp_imbalance", tmp_path)
    verdict, findings = expectations(RANKS / "ddp_imbalance.py")
    assert report["verdict"] == verdict, (report["findings"], report["_stderr"])
    imbalance = [f for f in report["findings"] if f["kind"] == "rank-imbalance"]
    assert len(imbalance) == 1, report["findings"]
    assert imbalance[0]["evidence"]["rank"] == 0
    assert imbalance[0]["pid"] == rank_agents(report)[0]["pid"]


def test_a_stray_context_on_the_other_gpu_is_found_with_its_rank_and_pid(tmp_path):
    need_gpus(2)
    two_gpus.stray_on_gpu_0(run_job("ddp_stray_context", tmp_path), reserved_there=False)


def test_cuda_visible_devices_maps_torch_device_0_to_nvml_gpu_1(tmp_path):
    need_gpus(2)
    report_path = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report_path),
                           str(ROOT / "scenarios" / "leak_training_list.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=environment(CUDA_VISIBLE_DEVICES="1"))
    report = json.loads(report_path.read_text())
    keep(report_path, "cuda_visible_devices_1.json")
    agent = next(a for a in report["recording"]["agents"] if a["pid"] == report["target"]["pid"])
    assert [(d["index"], d["nvml_index"]) for d in agent["devices"]] == [(0, 1)], agent["devices"]
    assert {b["device"] for b in report["breakdown"] if b["pid"] == agent["pid"]} == {1}
    assert {s["device"] for s in report["recording"]["nvml"] if s["pid"] == agent["pid"]} == {1}
    assert report["verdict"] == "leak", proc.stderr


# -- two GPUs: NCCL, FSDP, stray contexts (issue 29) --------------------------------------------

@pytest.mark.parametrize("name", list(two_gpus.JOBS))
def test_a_job_of_two_gpus(name, tmp_path):
    """On two H100s every clean NCCL job was `non-torch` (588 MiB outside PyTorch per rank), and no
    stray context was found: the NCCL jobs, FSDP and a tensor made before set_device."""
    need_gpus(2)
    report = run_job(name, tmp_path)
    verdict, _ = expectations(RANKS / f"{name}.py")
    assert report["verdict"] == verdict, (two_gpus.summaries(report), report["_stderr"])
    two_gpus.JOBS[name](report)
    two_gpus.events_in_every_rank(report)


# A job left running for `watch` and `ps`, started plainly by torchrun (no gpumemdoctor in it): every
# rank touches CUDA before set_device, so rank 1 holds a context on GPU 0, rank 0's GPU.
STRAY_JOB = """
import os, sys, time
from pathlib import Path
import torch
control = Path(sys.argv[1])
torch.cuda.synchronize()  # too early: GPU 0 on every rank
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
keep = torch.ones(64 << 20, device=f"cuda:{local}")  # 256 MiB on its own GPU
torch.cuda.synchronize()
(control / f"ready-{local}.tmp").write_text(str(os.getpid()))
(control / f"ready-{local}.tmp").replace(control / f"ready-{local}")  # seen whole or not at all
deadline = time.monotonic() + 120
while not (control / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def stray_job(tmp_path_factory):
    need_gpus(2)
    folder = tmp_path_factory.mktemp("stray-job")
    (folder / "job.py").write_text(STRAY_JOB)
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", str(folder / "job.py"), str(folder)], cwd=folder, env=environment(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((folder / f"ready-{r}").exists() for r in (0, 1)):
            assert launcher.poll() is None, launcher.stderr.read()
            assert time.monotonic() < deadline, "the job's ranks never got ready"
            time.sleep(0.1)
        ranks = {r: int((folder / f"ready-{r}").read_text()) for r in (0, 1)}
        time.sleep(1.0)  # NVML lists a new allocation within a millisecond; a second is plenty
        yield {"launcher": launcher.pid, "ranks": ranks, "folder": folder}
    finally:
        (folder / "stop").write_text("")
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()


def test_watch_on_the_launcher_flags_rank_1s_context_on_gpu_0(stray_job, tmp_path):
    """On two H100s `watch --pid` on the launcher showed rank 1's 612 MiB on GPU 0, unflagged."""
    log = tmp_path / "watch.jsonl"
    result = subprocess.run([sys.executable, "-m", "gpumemdoctor", "watch", "--pid", str(stray_job["launcher"]),
                             "--interval", "0.25", "--duration", "2", "--no-tui", "--jsonl", str(log)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, env=environment())
    assert result.returncode == 0, result.stderr
    keep(log, "watch_stray_context.jsonl")
    last = json.loads(log.read_text().splitlines()[-1])
    two_gpus.watch_flags(last)
    assert {r["rank"]: r["pid"] for r in last["processes"] if r["role"] == "rank"} == stray_job["ranks"]
    assert f"stray-context: rank 1 PID {stray_job['ranks'][1]} holds" in result.stdout
    assert f"Seen: stray-context: rank 1 (PID {stray_job['ranks'][1]})" in " ".join(result.stdout.split())


def test_ps_groups_the_job_by_its_launcher_and_flags_the_stray_context(stray_job, tmp_path):
    result = subprocess.run([sys.executable, "-m", "gpumemdoctor", "ps", "--json"], capture_output=True, text=True,
                            timeout=120, env=environment())
    assert result.returncode == 0, result.stderr
    (tmp_path / "ps.json").write_text(result.stdout)
    keep(tmp_path / "ps.json", "ps_stray_context.json")
    listed = json.loads(result.stdout)
    two_gpus.ps_flags(listed, stray_job["launcher"])
    (job,) = [j for j in listed["jobs"] if j["launcher"] and j["launcher"]["pid"] == stray_job["launcher"]]
    assert {r["rank"]: r["pid"] for r in job["ranks"]} == stray_job["ranks"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_reports_are_one_job(tmp_path):
    """Two nodes on one host, a GPU each (CUDA_VISIBLE_DEVICES), each under its own gpumemdoctor: their
    two reports are one job in `gpumemdoctor report a.json b.json` (multi-node by report files)."""
    need_gpus(2)
    port = _free_port()
    runs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "gpumemdoctor", "run", "-o", f"node{node}.json", "-m", "torch.distributed.run",
               "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
               "--master-port", str(port), str(RANKS / "ddp_clean.py")]
        runs.append(subprocess.Popen(cmd, cwd=tmp_path, env=environment(CUDA_VISIBLE_DEVICES=str(node)),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = [r.communicate(timeout=300) for r in runs]
    for node, (r, (_, err)) in enumerate(zip(runs, done)):
        assert r.returncode == 0, err
        keep(tmp_path / f"node{node}.json", f"two_nodes_node{node}.json", err)
    merged = subprocess.run([sys.executable, "-m", "gpumemdoctor", "report", "node0.json", "node1.json",
                             "--width", "120"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert "2 ranks on 1 host" in merged.stdout and "not in these reports" not in merged.stdout, merged.stdout
    from gpumemdoctor.diagnosis.diagnose import diagnose_job
    from gpumemdoctor.app.report_file import load

    two_gpus.two_nodes(diagnose_job([load(str(tmp_path / f"node{n}.json"))[0] for n in (0, 1)]))


@pytest.mark.parametrize("name", list(two_gpus.FOUR_RANKS))
def test_an_fsdp_job_on_four_ranks(name, tmp_path):
    """Issue 42: the clean FSDP2 job and the one that leaks on rank 1, on four ranks, a GPU each."""
    need_gpus(4)
    report = run_job(name, tmp_path, keep_as=f"{name}_4ranks", ranks=4)
    verdict, _ = expectations(RANKS / f"{name}.py")
    assert report["verdict"] == verdict, (two_gpus.summaries(report), report["_stderr"])
    two_gpus.FOUR_RANKS[name](report)
