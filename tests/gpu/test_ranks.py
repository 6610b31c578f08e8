"""Multi-rank jobs, run for real: `gpumemdoctor run -m torch.distributed.run --nproc-per-node 2`
over the scenarios in scenarios/ranks. On one GPU the two ranks share it (gloo); the stray
context and CUDA_VISIBLE_DEVICES need two GPUs (NCCL) and skip otherwise.

Set GPUMEMDOCTOR_FIXTURE_DIR to keep each report (in its `ranks/` folder): that is how
tests/fixtures/ranks is made.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.expect import expectations

ROOT = Path(__file__).resolve().parents[2]
RANKS = ROOT / "scenarios" / "ranks"
SKIP_EXIT = 77
MIB = 1 << 20
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetCount()


def run_job(name: str, tmp_path: Path, keep_as: str | None = None) -> dict:
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report), "-m", "torch.distributed.run",
           "--standalone", "--nproc-per-node", "2", str(RANKS / f"{name}.py")]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **NO_MULTICAST})
    if proc.returncode == SKIP_EXIT or "skip: this scenario needs" in proc.stderr:
        pytest.skip("the scenario needs more GPUs than this machine has")
    assert report.exists(), proc.stderr
    data = json.loads(report.read_text())
    keep = os.environ.get("GPUMEMDOCTOR_FIXTURE_DIR")
    if keep:
        folder = Path(keep) / "ranks"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(report, folder / f"{keep_as or name}.json")
        (folder / f"{keep_as or name}.stderr.txt").write_text(proc.stderr)
    data["_stderr"] = proc.stderr
    data["_returncode"] = proc.returncode
    return data


def rank_agents(report: dict) -> dict:
    """rank -> its agent, for the processes that ran as ranks."""
    out = {}
    for agent in report["recording"]["agents"]:
        dist = agent.get("dist")
        if dist and dist.get("rank") is not None:
            out[dist["rank"]] = agent
    return out


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
    if gpu_count() < 2:
        pytest.skip("needs two GPUs")
    report = run_job("ddp_stray_context", tmp_path)
    stray = [f for f in report["findings"] if f["kind"] == "stray-context"]
    agents = rank_agents(report)
    assert [(f["evidence"]["rank"], f["device"]) for f in stray] == [(1, 0)], report["findings"]
    assert stray[0]["pid"] == agents[1]["pid"]
    assert stray[0]["bytes"] >= 300 * MIB  # a context with torch is about 500 MiB


def test_cuda_visible_devices_maps_torch_device_0_to_nvml_gpu_1(tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs two GPUs")
    report_path = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report_path),
                           str(ROOT / "scenarios" / "leak_training_list.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **NO_MULTICAST, "CUDA_VISIBLE_DEVICES": "1"})
    report = json.loads(report_path.read_text())
    keep = os.environ.get("GPUMEMDOCTOR_FIXTURE_DIR")
    if keep:
        (Path(keep) / "ranks").mkdir(parents=True, exist_ok=True)
        shutil.copy(report_path, Path(keep) / "ranks" / "cuda_visible_devices_1.json")
    agent = next(a for a in report["recording"]["agents"] if a["pid"] == report["target"]["pid"])
    assert [(d["index"], d["nvml_index"]) for d in agent["devices"]] == [(0, 1)], agent["devices"]
    assert {b["device"] for b in report["breakdown"] if b["pid"] == agent["pid"]} == {1}
    assert {s["device"] for s in report["recording"]["nvml"] if s["pid"] == agent["pid"]} == {1}
    assert report["verdict"] == "leak", proc.stderr
